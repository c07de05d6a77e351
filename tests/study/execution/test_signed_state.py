"""A ``--resume`` unpickles only Tune state the study signed (issue 61, item 1): a ``tuner.pkl`` planted in a
finished study's folder (a pickle whose ``__reduce__`` is ``os.system("touch MARKER")``) ran as whoever resumed.
Now every file of Tune's state that a resume unpickles (``tuner.pkl``, ``experiment_state-*.json`` and the hex
cloudpickles Ray decodes in it, the searcher's and callbacks' ``*-state-*`` files, a trial's ``error.pkl``) must be
one the study signed as Tune wrote it (study/execution/state_signature.py), else the resume refuses in one line
before anything of it is read. The signing key lives in each test's own cache folder."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.fs
import pyrun
import pytest

from dcl_core.config import ConfigError
from dcl_core.data import resolve_data_root
from dcl_core.study.execution import tune_state
from dcl_core.study.execution.state_signature import MANIFEST, SignState, unsigned, vouch
from dcl_core.study.plan import signing

REPO = Path(__file__).resolve().parents[3]
STATE = "experiment_state-2026-01-01_00-00-00.json"
VARIANTS = "basic-variant-state-2026-01-01_00-00-00.json"


class Evil:
    """A pickle that runs a command as it is read."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache folder, where the signing key lives (never the user's)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _digests(folder: Path, names: list[str]) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


@pytest.fixture
def exp(tmp_path: Path) -> Path:
    """An experiment folder as a study leaves it: Tune's state and a failed trial's error.pkl, signed."""
    d = tmp_path / "ray_results" / "s"
    (d / "t_00000").mkdir(parents=True)
    (d / STATE).write_text(json.dumps({"trial_data": [["{}", "{}"]], "runner_data": {}}))
    (d / VARIANTS).write_bytes(pickle.dumps({"variants": 1}))
    (d / "tuner.pkl").write_bytes(pickle.dumps({"tuner": 1}))
    (d / "t_00000" / "error.pkl").write_bytes(pickle.dumps(ValueError("x")))
    (d / "t_00000" / "params.pkl").write_bytes(b"never read by a resume")
    assert vouch(str(d), _digests(d, [STATE, VARIANTS, "tuner.pkl", "t_00000/error.pkl"]))
    return d


def test_a_state_the_study_signed_reads_as_signed(exp: Path) -> None:
    assert unsigned(str(exp)) is None
    assert unsigned(exp.as_uri()) is None  # a file:// storage, as pyarrow opens s3:// or gs://
    tune_state.check_signed(str(exp))


@pytest.mark.parametrize("planted", ["tuner.pkl", STATE, VARIANTS, "t_00000/error.pkl",
                                     "callback-states-2099-01-01_00-00-00.pkl",
                                     "searcher-state-2099-01-01_00-00-00.pkl", "t_00001/error.pkl"])
def test_every_pickle_a_resume_reads_is_refused_unless_the_study_signed_it(exp: Path, tmp_path: Path,
                                                                         planted: str) -> None:
    marker = tmp_path / "MARKER"
    path = exp / planted
    path.parent.mkdir(exist_ok=True)
    if planted == STATE:  # still valid JSON, with a payload Ray's reader decodes with cloudpickle
        state = json.loads(path.read_text())
        state["stats"] = {"_type": "CLOUDPICKLE_FALLBACK", "value": pickle.dumps(Evil(marker)).hex()}
        path.write_text(json.dumps(state))
    else:
        path.write_bytes(pickle.dumps(Evil(marker)))
    assert unsigned(str(exp)) == planted
    with pytest.raises(ConfigError) as err:
        tune_state.check_signed(str(exp))
    line = str(err.value)
    assert line.startswith(f"cannot resume: {planted} in Tune's saved state in {exp} is not as this study wrote it")
    assert "\n" not in line and "--overwrite" in line
    assert not marker.exists() and path.exists()  # nothing read, nothing deleted


def test_a_fifo_or_a_folder_at_a_pickle_s_name_is_refused_without_waiting(exp: Path) -> None:
    os.mkfifo(exp / "callback-states-2099-01-01_00-00-00.pkl")
    assert unsigned(str(exp)) == "callback-states-2099-01-01_00-00-00.pkl"  # never opened: a FIFO would block
    os.unlink(exp / "callback-states-2099-01-01_00-00-00.pkl")
    (exp / "searcher-state-x.pkl").mkdir()
    assert unsigned(str(exp)) == "searcher-state-x.pkl"


@pytest.mark.parametrize("forgery", ["no manifest", "another key's", "another experiment's", "edited"])
def test_a_manifest_the_study_did_not_sign_as_it_is_signs_nothing(exp: Path, forgery: str) -> None:
    manifest = exp / MANIFEST
    if forgery == "no manifest":
        manifest.unlink()
    elif forgery == "another key's":
        signing.key_path().unlink()
        assert signing.key(create=True) is not None  # a new key: the manifest's signature is no longer this user's
    elif forgery == "another experiment's":  # this user's own manifest, copied from another folder
        other = exp.parent / "other"
        shutil.copytree(exp, other)
        vouch(str(other), {"tuner.pkl": hashlib.sha256(b"planted").hexdigest()})
        shutil.copy(other / MANIFEST, manifest)
    else:  # a planted tuner.pkl's digest written into the manifest
        (exp / "tuner.pkl").write_bytes(b"planted")
        data = json.loads(manifest.read_text())
        data["files"]["tuner.pkl"] = [hashlib.sha256(b"planted").hexdigest()]
        manifest.write_text(json.dumps(data))
    assert unsigned(str(exp)) is not None


def test_without_a_private_key_nothing_is_signed_and_the_resume_says_why(exp: Path) -> None:
    signing.key_path().chmod(0o644)  # others may read it: not a key
    assert unsigned(str(exp)) is not None
    with pytest.raises(ConfigError, match=r"no private key at .* \(set XDG_CACHE_HOME to a private folder"):
        tune_state.check_signed(str(exp))


def _trial(staging: Path, storage: Path) -> SimpleNamespace:
    """What SignState reads of a Tune trial: its storage (Ray's StorageContext)."""
    return SimpleNamespace(storage=SimpleNamespace(experiment_driver_staging_path=str(staging),
                                                   storage_filesystem=pyarrow.fs.LocalFileSystem(),
                                                   experiment_fs_path=str(storage)))


def _sync(staging: Path, storage: Path) -> None:
    shutil.copytree(staging, storage, dirs_exist_ok=True)  # Tune's copy of its driver's files to the storage


def test_tune_s_state_is_signed_between_its_save_and_its_copy_to_the_storage(tmp_path: Path) -> None:
    """Tune saves into its staging folder, asks its callbacks for their state, then copies the folder to the
    storage: a driver killed during the copy (or before the next save's) leaves files that are all signed."""
    staging, storage = tmp_path / "staging" / "s", tmp_path / "ray_results" / "s"
    (staging / "t_00000").mkdir(parents=True)
    storage.mkdir(parents=True)
    callback = pickle.loads(pickle.dumps(SignState()))  # as restored from tuner.pkl
    callback.on_step_begin(0, [_trial(staging, storage)])
    for save in range(3):
        (staging / STATE).write_text(json.dumps({"trial_data": [], "save": save}))
        (staging / VARIANTS).write_bytes(pickle.dumps({"save": save}))
        if save == 2:
            (staging / "t_00000" / "error.pkl").write_bytes(pickle.dumps(ValueError(save)))
        assert callback.get_state() is None  # no state of its own: Tune writes no callback-states pickle
        assert unsigned(str(storage)) is None  # killed before the copy: the last save's files are still signed
        _sync(staging, storage)
        assert unsigned(str(storage)) is None
    assert not list(storage.glob("callback-states-*"))
    # A trial's failure writes its error.pkl between two saves; a copy still under way may take it along.
    (staging / "t_00001").mkdir()
    (staging / "t_00001" / "error.pkl").write_bytes(pickle.dumps(ValueError("between saves")))
    callback.on_trial_error(0, [_trial(staging, storage)], None)
    _sync(staging, storage)
    assert unsigned(str(storage)) is None


def test_a_copy_of_the_state_is_taken_and_put_back_only_as_signed(exp: Path) -> None:
    assert tune_state.backup(exp)
    (exp / STATE).write_text('{"trial_da')  # Tune's save cut short by a full disk
    tune_state.check_signed(str(exp))  # the signed copy is put back, and signed in place
    assert unsigned(str(exp)) is None and json.loads((exp / STATE).read_text())["trial_data"]
    # A copy changed since the study took it is never put back.
    copy = exp / tune_state.BACKUP_DIR
    (copy / "tuner.pkl").write_bytes(b"planted")
    (exp / STATE).write_text('{"trial_da')
    assert not tune_state.restore_backup(exp)
    with pytest.raises(ConfigError, match="is damaged"):
        tune_state.check_signed(str(exp))
    assert (copy / "tuner.pkl").read_bytes() == b"planted"
    # Nor is state the study did not sign copied.
    shutil.rmtree(copy)
    (exp / STATE).write_text(json.dumps({"trial_data": [["{}", "{}"]], "runner_data": {}, "planted": 1}))
    assert not tune_state.backup(exp) and not copy.exists()


# ------------------------------------------------------------------------------------- a real study, resumed

needs_data = pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                                reason="embedded CIFAR-10 not present")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A finished smoke study (real Ray, its state signed with a key in its own cache folder) and its env."""
    root = tmp_path_factory.mktemp("signed")
    env = {**os.environ, "XDG_CACHE_HOME": str(root / "cache")}
    out = root / "out"
    proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", "dcl",
                      "--output-dir", str(out), "--num-cpus", "1", "-q"],
                     capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, env


@pytest.mark.slow  # a real smoke study (Ray), then a --resume in a process of its own per planted pickle
@needs_data
@pytest.mark.parametrize("planted", ["tuner.pkl", "experiment_state", "basic-variant-state",
                                     "callback-states-2099-01-01_00-00-00.pkl"])
def test_a_pickle_planted_in_a_finished_study_never_runs_on_resume(finished: tuple[Path, dict[str, str]],
                                                                  tmp_path: Path, planted: str) -> None:
    """Issue reproduction: a planted tuner.pkl touched MARKER on ``--resume`` (then Tune's traceback)."""
    out, env = finished
    exp = out / "ray_results" / "temperature_sweep"
    marker = tmp_path / "MARKER"
    (target,) = [exp / planted] if planted.endswith(".pkl") else sorted(exp.glob(f"{planted}-*.json"))[-1:]
    before = target.read_bytes() if target.exists() else None
    try:
        if planted == "experiment_state":  # a payload Ray's reader decodes with cloudpickle, in valid JSON
            state = json.loads(before or b"{}")
            state["stats"] = {"_type": "CLOUDPICKLE_FALLBACK", "value": pickle.dumps(Evil(marker)).hex()}
            target.write_text(json.dumps(state))
        else:
            target.write_bytes(pickle.dumps(Evil(marker)))
        proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses",
                          "dcl", "--output-dir", str(out), "--num-cpus", "1", "--resume"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    finally:
        if before is None:
            target.unlink()
        else:
            target.write_bytes(before)
    assert not marker.exists(), "the planted pickle ran"
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{target.name} in Tune's saved state in {exp} is not as this study wrote it" \
        in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow  # a study script in a process of its own (it stops before Ray starts)
@needs_data
def test_a_study_that_could_not_sign_its_state_does_not_start(tmp_path: Path) -> None:
    """Where no private key can be kept, nothing it saved could be resumed (nor a round of --until-resolved run):
    one line, exit 2, before Ray starts, and no folder made."""
    signing.key(create=True)
    signing.key_path().chmod(0o644)  # others may read it: not a key
    out = tmp_path / "out"
    proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--output-dir",
                      str(out), "--num-cpus", "1"], capture_output=True, text=True, timeout=120, cwd=REPO,
                     env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no private key can be kept at" in errors[0] and "XDG_CACHE_HOME" in errors[0]
    assert "Traceback" not in proc.stderr and not out.exists()
