"""``python -m dcl_core.export``: a checkpoint's encoder as a plain state dict that torchvision's own ResNet-18 loads
at width 1, and dcl_core's own backbone at any width, each with ``strict=True`` by docs/evaluation.md's recipe as
written, giving the project's features to 1e-5 on real images; bad input exits 2 in one line, a place the files
must not go (a device, a FIFO, a link, the checkpoint, weights named .json) before the checkpoint is read."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest
import torch
from cifar10_present import cifar10_present

from dcl_core.config import apply_overrides, from_flat_dict, preset, to_flat_dict
from dcl_core.data import EvalTransform, load_dataset, normalization_for
from dcl_core.export import main
from dcl_core.training import train
from dcl_core.training.backbone_export import describe, export
from dcl_core.training.builders import build_model
from dcl_core.training.checkpoint import load_checkpoint, save_checkpoint

needs_data = pytest.mark.skipif(not cifar10_present(), reason="CIFAR-10 not present")


def _trained(tmp_path: Path, width: float) -> Path:
    cfg = apply_overrides(preset("smoke"), {"model.width": width, "optim.epochs": 1, "threads": 2,
                                            "output_dir": str(tmp_path / f"run{width:g}")})
    train(cfg)
    return tmp_path / f"run{width:g}" / "checkpoint.pt"


REPO = Path(__file__).resolve().parents[2]


def _recipe(title: str) -> str:
    """The python block of docs/evaluation.md whose first line is the comment ``# {title}``, unindented."""
    page = (REPO / "docs" / "evaluation.md").read_text()
    blocks = re.findall(r"\n *```python\n(.*?)\n *```", page, flags=re.S)
    (block,) = [b for b in blocks if b.lstrip().startswith(f"# {title}")]
    lines = block.splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def _load_as_documented(title: str, out: Path) -> torch.nn.Module:
    """Run the documented recipe as a reader would paste it, in the export's folder; its ``model``."""
    scope: dict = {}
    cwd = Path.cwd()
    try:
        os.chdir(out.parent)
        exec(_recipe(title), scope)  # the documented recipe itself
    finally:
        os.chdir(cwd)
    return scope["model"].eval()


def _same_features(checkpoint: Path, model: torch.nn.Module, dim: int) -> None:
    """``model`` gives the checkpoint's backbone features on 40 real CIFAR-10 test images, to 1e-5."""
    state = load_checkpoint(checkpoint)
    ours = build_model(from_flat_dict(state["config"]))
    ours.load_state_dict(state["model"])
    ours.eval()
    images = load_dataset("cifar10", "test", per_class=4, seed=0).images  # 40 real test images, uint8
    x = EvalTransform(32, *normalization_for("cifar10"))(images)  # (40, 3, 32, 32) normalized
    with torch.no_grad():
        expected, got = ours.backbone(x), model(x)
    assert got.shape == expected.shape == (40, dim)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0), (got - expected).abs().max()


@needs_data
@pytest.mark.slow  # trains, exports and loads a network: ~30 s
def test_torchvision_loads_the_export_strictly_and_gives_the_same_features(tmp_path: Path) -> None:
    checkpoint = _trained(tmp_path, 1.0)
    out = tmp_path / "export" / "backbone.pt"
    meta = export(checkpoint, out)
    assert meta == json.loads(out.with_suffix(".json").read_text())
    assert meta["arch"] == "resnet18" and meta["torchvision_compatible"] and meta["stem"] == "cifar"
    assert meta["feature_dim"] == 512 and meta["epochs"] == 1 and meta["loss"] == "dcl"
    model = _load_as_documented("torchvision's own model (width 1)", out)
    assert type(model).__module__ == "torchvision.models.resnet"  # torchvision's, not this package's
    _same_features(checkpoint, model, 512)


@needs_data
def test_another_width_loads_into_the_projects_backbone_as_documented(tmp_path: Path) -> None:
    """The width the CPU studies train (what `study export --best` of the default study gives): torchvision's model
    refuses it, the documented builder recipe loads it strictly with the same features."""
    checkpoint = _trained(tmp_path, 0.125)
    out = tmp_path / "export" / "backbone.pt"
    meta = export(checkpoint, out)
    assert not meta["torchvision_compatible"] and meta["width"] == 0.125 and meta["feature_dim"] == 64
    assert "dcl_core.models.build_backbone loads it" in describe(meta)
    with pytest.raises(RuntimeError, match="size mismatch"):  # why the JSON says torchvision_compatible: false
        _load_as_documented("torchvision's own model (width 1)", out)
    _same_features(checkpoint, _load_as_documented("dcl_core's backbone (any width)", out), 64)


def test_a_missing_or_foreign_checkpoint_exits_2_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "foreign.pt").write_bytes(b"not a checkpoint")
    for path in (tmp_path / "none.pt", tmp_path / "foreign.pt"):
        assert main([str(path), "-o", str(tmp_path / "out.pt")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and path.name in err[0], err
    assert not (tmp_path / "out.pt").exists()



# ---- where the export goes (issue 46, items 2 and 10): checked before the checkpoint is read, one line each


def _checkpoint(tmp_path: Path, **overrides: object) -> Path:
    """A real checkpoint of the smoke preset's model at width 0.125 (untrained: nothing here needs training)."""
    cfg = apply_overrides(preset("smoke"), {"model.width": 0.125, **overrides})
    state = {"epoch": 1, "model": build_model(cfg).state_dict(), "optimizer": {}, "scaler": {},
             "config": to_flat_dict(cfg), "history": [{"eval/knn_top1": 12.5}]}
    return save_checkpoint(state, tmp_path / "run" / "checkpoint.pt")


def _refused(checkpoint: Path, out: Path, capsys: pytest.CaptureFixture[str], code: int = 2) -> str:
    """The one line ``python -m dcl_core.export CHECKPOINT -o OUT`` exits ``code`` with."""
    assert main([str(checkpoint), "-o", str(out)]) == code
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in captured.err, captured.err
    return err[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_export_onto_a_device_or_a_fifo_is_refused_and_the_node_kept(tmp_path: Path, capsys) -> None:
    """``-o /dev/null`` as root turned the device into a 742 KB file and wrote /dev/null.json beside it."""
    checkpoint = _checkpoint(tmp_path)
    os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the device /dev/null is, made here
    os.mkfifo(tmp_path / "fifo")
    os.mknod(tmp_path / "desc.json", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a device where the description goes
    for out, node in (("null", "null is a character device"), ("fifo", "fifo is a FIFO"),
                      ("desc.pt", "desc.json is a character device")):
        assert f"{node}, not a regular file: refusing to replace it" in _refused(checkpoint, tmp_path / out, capsys)
    assert stat.S_ISCHR(os.lstat(tmp_path / "null").st_mode) and stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)
    assert stat.S_ISCHR(os.lstat(tmp_path / "desc.json").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["desc.json", "fifo", "null", "run"]  # nothing written


def test_export_never_overwrites_its_own_weights_a_link_s_target_or_the_checkpoint(tmp_path: Path, capsys) -> None:
    """``-o weights.json``: the description overwrote the weights and export said it succeeded."""
    checkpoint = _checkpoint(tmp_path)
    before = checkpoint.read_bytes()
    assert "the weights cannot go to a .json file" in _refused(checkpoint, tmp_path / "weights.json", capsys)
    assert "cannot go to a .json file" in _refused(checkpoint, tmp_path / "weights.JSON", capsys)
    precious = tmp_path / "precious.pt"
    precious.write_text("keep me")
    (tmp_path / "link.pt").symlink_to(precious)
    assert "link.pt is a symbolic link: refusing to write through it" in _refused(checkpoint, tmp_path / "link.pt",
                                                                                   capsys)
    (tmp_path / "b.json").symlink_to(precious)  # a link where the description goes
    assert "b.json is a symbolic link" in _refused(checkpoint, tmp_path / "b.pt", capsys)
    assert "is the checkpoint being exported" in _refused(checkpoint, checkpoint, capsys)
    assert "cannot write /proc/self/x: " in _refused(checkpoint, Path("/proc/self/x"), capsys)
    assert precious.read_text() == "keep me" and checkpoint.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "link.pt", "precious.pt", "run"]
    # a regular file is replaced, the description written beside it
    (tmp_path / "old.pt").write_text("an earlier export")
    assert main([str(checkpoint), "-o", str(tmp_path / "old.pt")]) == 0
    assert json.loads((tmp_path / "old.json").read_text())["width"] == 0.125
    assert "conv1.weight" in torch.load(tmp_path / "old.pt", weights_only=True)
    assert main([str(checkpoint), "-o", str(tmp_path / "old.pt")]) == 0  # again: the earlier export replaced
    # issue reproduction: -o run/config.pt replaced the run's config.json (not named) with the description
    config = checkpoint.parent / "config.json"
    config.write_text('{"loss.name": "dcl"}')
    assert "config.json exists and is not an earlier export's description" in _refused(
        checkpoint, checkpoint.parent / "config.pt", capsys)
    assert config.read_text() == '{"loss.name": "dcl"}' and not (checkpoint.parent / "config.pt").exists()


def test_the_json_names_a_user_loss_by_its_absolute_file_and_carries_its_params(tmp_path: Path) -> None:
    """A run of docs/examples/my_losses.py:PositiveWeighted with positive_weight 0.5: its JSON had the loss's name
    and no ``loss.params``, so the weights did not say which loss trained them. A built-in's params are ``{}``."""
    reference = f"{REPO / 'docs' / 'examples' / 'my_losses.py'}:PositiveWeighted"
    checkpoint = _checkpoint(tmp_path, **{"loss.name": reference, "loss.params": '{"positive_weight": 0.5}'})
    assert main([str(checkpoint), "-o", str(tmp_path / "mine.pt")]) == 0
    meta = json.loads((tmp_path / "mine.json").read_text())
    assert meta["loss"] == reference and meta["loss_params"] == {"positive_weight": 0.5}
    assert main([str(_checkpoint(tmp_path / "builtin")), "-o", str(tmp_path / "dcl.pt")]) == 0
    meta = json.loads((tmp_path / "dcl.json").read_text())
    assert meta["loss"] == "dcl" and meta["loss_params"] == {}


def test_an_output_ending_in_a_slash_is_a_folder_not_a_file(tmp_path: Path, capsys) -> None:
    """Issue reproduction: ``-o ex4/`` wrote a file named ``ex4`` (and ``ex4.json``)."""
    checkpoint = _checkpoint(tmp_path)
    assert main([str(checkpoint), "-o", f"{tmp_path / 'ex4'}/"]) == 2
    err = capsys.readouterr().err
    assert "ex4/ names a folder (it ends in /), not a file" in err and err.count("\n") == 1, err
    assert not (tmp_path / "ex4").exists() and not (tmp_path / "ex4.json").exists()


@pytest.mark.parametrize(("argv", "needle"), [
    (["--no-knn"], "--no-knn without --linear leaves nothing to evaluate"),  # loaded everything, printed the epoch
    (["--set", "device=cpu", "--device", "auto"], "--set device and --device both set device"),
    (["--set", "eval.linear_preset=cpu", "--linear-preset", "smoke"], "--set eval.linear_preset and --linear-preset"),
    (["--set", "output_dir=x"], "--set output_dir: an evaluation writes nothing"),  # accepted, ignored
])
def test_evaluate_refuses_what_it_would_ignore_in_one_line(tmp_path: Path, capsys, argv, needle) -> None:
    """Issue reproductions: ``--set device=cuda`` was overridden by ``--device``'s default (auto) and ran on the
    CPU; the other options were ignored, silently."""
    from dcl_core.evaluate import main as evaluate

    assert evaluate([str(_checkpoint(tmp_path)), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err, err
