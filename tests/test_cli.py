"""The real ``weightd`` entry point: outputs, exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tiering.content.safetensors_header import read_header
from tiering.sample import mutate_tensor

from .conftest import assert_one_line_error


def test_build_verify_diff_end_to_end(weightd, ckpt: Path, tmp_path: Path) -> None:
    proc = weightd("manifest", "build", ckpt)
    assert proc.returncode == 0, proc.stderr
    written = ckpt / ".weightd" / "manifest.json"
    assert proc.stdout.strip().splitlines()[-1] == str(written) and written.is_file()

    proc = weightd("verify", ckpt)
    assert proc.returncode == 0 and proc.stdout.startswith("ok: "), proc.stderr

    v2 = tmp_path / "v2"
    shutil.copytree(ckpt, v2, ignore=shutil.ignore_patterns(".weightd"))
    shard = sorted(v2.glob("*.safetensors"))[0]
    name = read_header(shard).tensors[1].name
    nbytes = mutate_tensor(shard, name, "v2")
    out = tmp_path / "v2.json"
    assert weightd("manifest", "build", v2, "-o", out, "--name", "org/tiny", "--version", "v2").returncode == 0
    proc = weightd("manifest", "diff", ckpt, out, "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["files"]["changed"] == [shard.name]
    assert [t["name"] for t in d["tensors"]["changed"]] == [name]
    assert d["changed_bytes"] == nbytes
    text = weightd("manifest", "diff", ckpt, out).stdout
    assert f"~ {name}" in text and f"changed bytes: {nbytes} " in text


def test_build_json_and_stdout(weightd, ckpt: Path) -> None:
    proc = weightd("manifest", "build", ckpt, "--json")
    report = json.loads(proc.stdout)
    assert report["bytes"] > 0 and len(report["digest"]) == 32 and report["tensors"] > 0
    proc = weightd("manifest", "build", ckpt, "-o", "-")
    assert json.loads(proc.stdout)["digest"] == report["digest"]


def test_verify_exit_5_names_first_bad_tensor(weightd, ckpt: Path) -> None:
    assert weightd("manifest", "build", ckpt).returncode == 0
    shard = sorted(ckpt.glob("*.safetensors"))[2]
    t = read_header(shard).tensors[-1]
    with open(shard, "r+b") as fh:
        fh.seek(t.begin + 1)
        fh.write(b"\x00\x01\x02")
    proc = weightd("verify", ckpt)
    assert proc.returncode == 5
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("weightd: ") and t.name in last and shard.name in last
    report = json.loads(weightd("verify", ckpt, "--json").stdout)
    assert report["ok"] is False and report["problems"][0]["what"] == f"tensor {t.name!r}"


def test_verify_with_separate_manifest(weightd, ckpt: Path, tmp_path: Path) -> None:
    m = tmp_path / "m.json"
    assert weightd("manifest", "build", ckpt, "-o", m).returncode == 0
    assert weightd("verify", ckpt, "--manifest", m).returncode == 0
    (ckpt / "new-file.txt").write_text("x")
    assert_one_line_error(weightd("verify", ckpt, "--manifest", m), 5, "new-file.txt", "unexpected file")


@pytest.mark.parametrize("args,code,needle", [
    (["manifest", "build", "/nonexistent/dir"], 3, "no such directory"),
    (["verify", "/nonexistent/dir"], 3, "no such checkpoint"),
    (["manifest", "build", "{ckpt}", "--name", "../evil"], 2, "invalid name"),
    (["manifest", "build", "{ckpt}", "--name", "/abs"], 2, "invalid name"),
    (["manifest", "build", "{ckpt}", "--name", "a/b/c"], 2, "invalid name"),
    (["manifest", "build", "{ckpt}", "--version", "v1/x"], 2, "invalid version"),
    (["manifest", "build", "{ckpt}", "--version", ""], 2, "invalid version"),
    (["manifest", "build"], 2, "Missing argument"),
    (["manifest", "build", "{ckpt}", "--threads", "0"], 2, "--threads"),
    (["no-such-command"], 2, "No such command"),
    (["--config", "/nonexistent.toml", "config", "show"], 2, "file not found"),
])
def test_bad_input_one_line(weightd, ckpt: Path, args: list[str], code: int, needle: str) -> None:
    args = [a.replace("{ckpt}", str(ckpt)) for a in args]
    assert_one_line_error(weightd(*args), code, needle)


def test_verify_without_manifest_says_how(weightd, ckpt: Path) -> None:
    assert_one_line_error(weightd("verify", ckpt), 3, "weightd manifest build")


def test_hostile_checkpoints_change_nothing(weightd, ckpt: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in ckpt.iterdir())
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    good = shard.read_bytes()
    shard.write_bytes((10**7).to_bytes(8, "little") + good[8:])  # header length past the end of the file
    assert_one_line_error(weightd("manifest", "build", ckpt), 2, shard.name, "exceeds the file size")
    shard.write_bytes(good)
    (ckpt / "escape.json").symlink_to(tmp_path)
    assert_one_line_error(weightd("manifest", "build", ckpt), 2, "escape.json", "symlink")
    (ckpt / "escape.json").unlink()
    os.mkfifo(ckpt / "fifo")
    assert_one_line_error(weightd("manifest", "build", ckpt), 2, "fifo", "special file")
    (ckpt / "fifo").unlink()
    assert sorted(p.name for p in ckpt.iterdir()) == before  # no .weightd/ was written for a bad checkpoint


def test_hostile_manifest_for_verify(weightd, ckpt: Path, tmp_path: Path) -> None:
    m = tmp_path / "m.json"
    assert weightd("manifest", "build", ckpt, "-o", m).returncode == 0
    d = json.loads(m.read_text())
    d["files"][0]["path"] = "../../etc/passwd"
    m.write_text(json.dumps(d))
    assert_one_line_error(weightd("verify", ckpt, "--manifest", m), 2, "relative")
    d["files"][0]["path"] = "/etc/passwd"
    m.write_text(json.dumps(d))
    assert_one_line_error(weightd("verify", ckpt, "--manifest", m), 2, "absolute")
    m.write_text("not json")
    assert_one_line_error(weightd("verify", ckpt, "--manifest", m), 2, "not valid JSON")


def test_debug_shows_traceback(weightd) -> None:
    proc = weightd("--debug", "manifest", "build", "/nonexistent/dir")
    assert proc.returncode == 3 and "Traceback" in proc.stderr


def test_torch_is_never_imported(weightd, ckpt: Path) -> None:
    code = ("import sys; from weightd.cli import main; rc = main(['manifest', 'build', sys.argv[1], '-o', '-']); "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'; sys.exit(rc)")
    import subprocess
    proc = subprocess.run([sys.executable, "-c", code, str(ckpt)], capture_output=True, text=True,
                          env=weightd.env, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_command_imports_only_its_own_module(weightd) -> None:
    """``weightd warm`` does not import what publish, doctor or serve need (the lazy group)."""
    import subprocess
    code = ("import sys; from weightd.cli import main; rc = main(['warm', '--help']); "
            "print(sorted(m for m in sys.modules if m.startswith('weightd.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=weightd.env, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = out.stdout.strip().splitlines()[-1]
    assert "weightd.cli.pagecache" in loaded
    for other in ("tiers", "transfer", "content", "diagnose", "system", "intent"):
        assert f"weightd.cli.{other}'" not in loaded, loaded


def test_every_command_has_an_example_and_every_option_help(weightd, tmp_path) -> None:
    """Every --help ends with an example, every option says what it does, and no internal jargon."""
    import click

    from weightd.cli import cli
    from weightd.cli.app import COMMANDS
    cli.load_all()
    assert sorted(cli.commands) == sorted(COMMANDS)   # every command is where the lazy group looks for it
    seen = 0

    def walk(group: click.Group, prefix: list[str]):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from walk(cmd, prefix + [name])
            else:
                yield prefix + [name], cmd
    for path, cmd in walk(cli, []):
        seen += 1
        assert "Example" in (cmd.help or ""), " ".join(path)
        assert "seed report" not in (cmd.help or ""), " ".join(path)
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden:
                assert p.help, f"{' '.join(path)} {p.opts}"
    assert seen >= 20
    r = weightd("preload", "--help")
    assert r.returncode == 0 and "Example:" in r.stdout
    assert weightd("-V").stdout.startswith("weightd, version")
    r = weightd("completion", "bash")
    assert r.returncode == 0 and "_WEIGHTD_COMPLETE" in r.stdout
    r = weightd("sample", tmp_path / "s", "--size", "4MiB", "--shards", "2")
    assert r.returncode == 0, r.stderr
    assert len(list((tmp_path / "s").glob("*.safetensors"))) == 2
    assert weightd("manifest", "build", tmp_path / "s").returncode == 0
    assert weightd("sample", tmp_path / "s").returncode == 2  # not over an existing checkpoint
