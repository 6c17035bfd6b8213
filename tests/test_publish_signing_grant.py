"""``[publish] signing_key`` is never lent: a real daemon, a real member of ``[api] admin_group`` (uid
65534 with a supplementary group, seen by the daemon through SO_PEERCRED) publishing through the socket."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tiering.sample import make_checkpoint

from .test_trust_api import (NOBODY, ROOT, assert_refused, call, in_child, root_only, set_api, shared_dir,  # noqa: F401
                             start_daemon, tree_digest)

MiB = 1 << 20
ADMIN_GID, SIGNERS_GID = 4242, 4343


@root_only
def test_an_admin_who_cannot_read_the_signing_key_gets_nothing_signed_with_it(node_env, isolated_env, tmp_path: Path,
                                                                             shared_dir: Path) -> None:
    keys = shared_dir / "keys"
    keys.mkdir(mode=0o755)
    r = subprocess.run([sys.executable, "-m", "weightd", "keygen", str(keys / "fleet")], capture_output=True,
                       text=True, timeout=60, env=isolated_env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    key = keys / "fleet.pem"
    assert (key.stat().st_uid, key.stat().st_mode & 0o777) == (0, 0o600)
    sock = shared_dir / "weightd.sock"
    set_api(node_env, sock, group=NOBODY, admin_group=ADMIN_GID)
    node_env.config.write_text(node_env.config.read_text() + f'[publish]\nsigning_key = "{key}"\n')
    srcs = {}
    for name in ("a", "b", "c"):
        src = make_checkpoint(shared_dir / name, total_bytes=1 * MiB, shards=1, layers=1, seed=name)
        for dirpath, _, filenames in os.walk(src):
            os.chmod(dirpath, 0o755)
            for f in filenames:
                os.chmod(Path(dirpath, f), 0o644)
        srcs[name] = src
    d = start_daemon(node_env, isolated_env, tmp_path, sock)
    try:
        def publish(name: str):
            return lambda: call(sock, "POST", "publish", {"dir": str(srcs[name]), "name": f"org/{name}",
                                                          "version": "v1"})
        before = tree_digest(node_env.cold)
        # an admin by supplementary group who cannot read the root-only key: refused, nothing published
        status, doc = in_child(publish("a"), groups=(ADMIN_GID,))
        assert_refused(status, doc, f"uid {NOBODY}", "[publish] signing_key", str(key), "could not read that key")
        assert tree_digest(node_env.cold) == before
        assert not (node_env.cold / "org/a").exists()
        # the grant is the key's own permissions: its group may read it, so that group's admins may sign
        os.chown(key, 0, SIGNERS_GID)
        os.chmod(key, 0o640)
        status, doc = in_child(publish("b"), groups=(ADMIN_GID, SIGNERS_GID))
        assert status == 200, doc
        assert doc["signed_by"] == "fleet.pem" and (node_env.cold / "org/b/v1/.weightd/model.sig").is_file()
        # an admin outside that group still cannot
        assert_refused(*in_child(publish("a"), groups=(ADMIN_GID,)), f"uid {NOBODY}", "[publish] signing_key")
        assert not (node_env.cold / "org/a").exists()
        # root signs with it as before
        status, doc = call(sock, "POST", "publish", {"dir": str(srcs["c"]), "name": "org/c", "version": "v1"})
        assert status == 200 and doc["signed_by"] == "fleet.pem", doc
    finally:
        d.stop()
