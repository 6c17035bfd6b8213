"""Scanning a checkpoint directory: nothing outside it is ever read."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tiering import build_manifest, scan_checkpoint
from tiering.errors import BadInput, CheckpointNotFound, UnsafePath


def test_lists_every_regular_file_sorted(ckpt: Path) -> None:
    rel = [f.relpath for f in scan_checkpoint(ckpt)]
    assert rel == sorted(rel)
    assert "original/params.json" in rel and "tokenizer.json" in rel and "model.safetensors.index.json" in rel


def test_skips_tool_directories(ckpt: Path) -> None:
    for d in (".weightd", ".git/objects", ".cache/huggingface/download"):
        (ckpt / d).mkdir(parents=True)
        (ckpt / d / "x").write_text("tool data")
    (ckpt / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    rel = [f.relpath for f in scan_checkpoint(ckpt)]
    assert not any(r.startswith((".weightd/", ".git/", ".cache/huggingface/")) for r in rel)
    assert ".gitattributes" in rel


def test_symlink_inside_is_followed(ckpt: Path) -> None:
    (ckpt / "alias.json").symlink_to("config.json")
    f = {f.relpath: f for f in scan_checkpoint(ckpt)}["alias.json"]
    assert f.size == (ckpt / "config.json").stat().st_size


def test_symlink_escaping_is_rejected(ckpt: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("password")
    (ckpt / "leak.json").symlink_to(secret)
    with pytest.raises(UnsafePath, match="escapes the checkpoint"):
        scan_checkpoint(ckpt)
    (ckpt / "leak.json").unlink()
    (ckpt / "up").symlink_to("../..")
    with pytest.raises(UnsafePath):
        scan_checkpoint(ckpt)


def test_dangling_symlink(ckpt: Path) -> None:
    (ckpt / "gone.json").symlink_to("nothing-here.json")
    with pytest.raises(UnsafePath, match="dangling"):
        scan_checkpoint(ckpt)


def test_hf_cache_snapshot_symlinks_into_blobs(tmp_path: Path) -> None:
    repo = tmp_path / "models--org--m"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "deadbeef").write_text('{"a": 1}')
    (snap / "config.json").symlink_to("../../blobs/deadbeef")
    files = scan_checkpoint(snap)
    assert [f.relpath for f in files] == ["config.json"]
    assert build_manifest(snap).files[0].size == 8


def test_fifo_is_rejected(ckpt: Path) -> None:
    os.mkfifo(ckpt / "pipe")
    with pytest.raises(UnsafePath, match="special file"):
        scan_checkpoint(ckpt)


def test_socket_is_rejected(ckpt: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(ckpt / "sock"))
        with pytest.raises(UnsafePath, match="special file"):
            scan_checkpoint(ckpt)
    finally:
        s.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_device_is_rejected(ckpt: Path) -> None:
    os.mknod(ckpt / "null", 0o600 | 0o020000, os.makedev(1, 3))
    with pytest.raises(UnsafePath, match="special file"):
        scan_checkpoint(ckpt)


def test_non_utf8_name_is_rejected(ckpt: Path) -> None:
    with open(os.path.join(os.fsencode(ckpt), b"bad\xffname.json"), "w") as fh:
        fh.write("{}")
    with pytest.raises(UnsafePath, match="not valid UTF-8"):
        scan_checkpoint(ckpt)


def test_missing_and_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFound):
        scan_checkpoint(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInput, match="not a directory"):
        scan_checkpoint(tmp_path / "file")


def test_a_directory_swapped_for_a_symlink_mid_scan_is_never_entered(tmp_path: Path) -> None:
    """The scan walks by descriptor: a sub-directory replaced by a symlink to a secret directory
    between the listing and the descent (raced in here from the scan's own check hook, called on
    the top directory first) is refused, and nothing of the secret is listed or pinned."""
    import os
    import shutil

    import pytest

    from tiering import scan_checkpoint
    from tiering.errors import UnsafePath
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "weights.bin").write_bytes(b"TOP-SECRET")
    src = tmp_path / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "weights.bin").write_bytes(b"fine")
    (src / "config.json").write_text("{}")
    seen: list[str] = []

    def check(path: str, st: os.stat_result) -> None:
        seen.append(path)
        if path == str(src / "config.json"):  # sub/ is listed, not yet entered: swap it for a symlink now
            shutil.rmtree(src / "sub")
            (src / "sub").symlink_to(secret)

    with pytest.raises(UnsafePath, match="changed while it was scanned|escapes the checkpoint"):
        scan_checkpoint(src, check=check)
    assert not any("secret" in p or p.endswith("sub/weights.bin") for p in seen)


def test_the_scan_check_sees_every_inode_it_pins(tmp_path: Path) -> None:
    import os

    from tiering import scan_checkpoint
    src = tmp_path / "ckpt"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(b"x")
    (src / "y.bin").write_bytes(b"y")
    (src / "link.bin").symlink_to(src / "y.bin")
    got: dict[str, int] = {}
    files = scan_checkpoint(src, check=lambda p, st: got.__setitem__(p, st.st_ino))
    assert set(got) == {str(src), str(src / "a"), str(src / "a" / "x.bin"), str(src / "y.bin")}
    by_rel = {f.relpath: f for f in files}
    assert by_rel["link.bin"].ino == by_rel["y.bin"].ino == got[str(src / "y.bin")]
    assert os.fspath(by_rel["a/x.bin"].path) == str(src / "a" / "x.bin")
