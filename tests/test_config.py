"""Config: precedence, embedded default, errors that name the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from weightd.config import load as config_mod
from weightd.config import ConfigError, load_config


@pytest.fixture
def no_system_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    fake = tmp_path / "etc-weightd.toml"
    monkeypatch.setattr(config_mod, "SYSTEM_CONFIG", fake)
    return fake


ENV = {"HOME": "/home/alice", "USER": "alice"}


def test_embedded_default_for_unprivileged_user(no_system_config: Path) -> None:
    cfg = load_config(env=ENV)
    assert cfg.source == "embedded default"
    assert str(cfg.tiers.hot.path) == "/dev/shm/weightd-alice"
    assert str(cfg.tiers.warm.path) == "/home/alice/.cache/weightd"
    assert str(cfg.state_dir) == "/home/alice/.local/state/weightd"
    assert cfg.tiers.hot.capacity.resolve(1000) == 500
    assert cfg.p2p.threshold == 10 << 30
    assert cfg.metrics.listen == "127.0.0.1:9464"
    xdg = load_config(env={**ENV, "XDG_CACHE_HOME": "/xdg/cache", "XDG_RUNTIME_DIR": "/run/user/1000"})
    assert str(xdg.tiers.warm.path) == "/xdg/cache/weightd"
    assert str(xdg.api.socket) == "/run/user/1000/weightd.sock"


def test_precedence(no_system_config: Path, tmp_path: Path) -> None:
    explicit, from_env = tmp_path / "a.toml", tmp_path / "b.toml"
    explicit.write_text('[tiers.hot]\ncapacity = "1GiB"\n')
    from_env.write_text('[tiers.hot]\ncapacity = "2GiB"\n')
    no_system_config.write_text('[tiers.hot]\ncapacity = "3GiB"\n')
    env = {**ENV, "WEIGHTD_CONFIG": str(from_env)}
    assert load_config(explicit, env=env).tiers.hot.capacity.bytes == 1 << 30
    assert load_config(env=env).tiers.hot.capacity.bytes == 2 << 30
    assert load_config(env=ENV).tiers.hot.capacity.bytes == 3 << 30
    assert load_config(env=ENV).source == str(no_system_config)


def test_file_overrides_only_what_it_sets(no_system_config: Path, tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('state_dir = "/var/lib/weightd"\n[tiers.warm]\npath = "/nvme/weightd"\ncapacity = "40%"\n'
                 '[p2p]\nthreshold = "1GB"\npeers = ["10.0.0.1:6881"]\nupload_limit = "100MB"\n')
    cfg = load_config(f, env=ENV)
    assert str(cfg.tiers.warm.path) == "/nvme/weightd" and cfg.tiers.warm.capacity.fraction == 0.4
    assert str(cfg.tiers.hot.path) == "/dev/shm/weightd-alice"
    assert cfg.p2p.threshold == 10**9 and cfg.p2p.upload_limit == 10**8 and cfg.p2p.peers == ("10.0.0.1:6881",)


@pytest.mark.parametrize("text,key,message", [
    ('[tiers.hot]\ncapacity = "64XB"', "tiers.hot.capacity", "size like"),
    ('[tiers.hot]\ncapacity = "140%"', "tiers.hot.capacity", "between 0% and 100%"),
    ('[tiers.hot]\nsize = 1', "tiers.hot.size", "unknown key"),
    ('colour = "blue"', "colour", "unknown key"),
    ('[tiers.warm]\npath = "relative/dir"', "tiers.warm.path", "absolute"),
    ('[p2p]\nlisten = "localhost"', "p2p.listen", "IP:PORT"),
    ('[p2p]\nallow = ["10.0.0.0/33"]', "p2p.allow", "CIDR"),
    ('[p2p]\ntrackers = ["ftp://x"]', "p2p.trackers", "URL"),
    ('[p2p]\nrack = "row 3/rack 7"', "p2p.rack", "rack name"),
    ('[p2p]\nrack = "-r"', "p2p.rack", "starting with a letter or digit"),
    ('[warm]\nconcurrency = 0', "warm.concurrency", "greater than"),
    ('[p2p]\npiece_size = "3MiB"', "p2p.piece_size", "power of two"),
    ('[p2p]\npiece_size = "1GiB"', "p2p.piece_size", "power of two"),
    ('[tiers.hot]\nlow_watermark = "99%"', "tiers.hot", "low_watermark"),
    ('[metrics]\nlisten = "1.2.3.4:99999"', "metrics.listen", "IP:PORT"),
    ('[p2p]\ncrossing = true', "p2p", "needs p2p.rack, p2p.plan and an http(s) tracker"),
    ('[p2p]\ncrossing = true\nrack = "r1"', "p2p", "needs p2p.rack, p2p.plan and an http(s) tracker"),
    ('[p2p]\ncrossing = true\nrack = "r1"\ntrackers = ["udp://10.0.0.1:6969"]', "p2p", "an http(s) tracker"),
    ('[p2p]\ncrossing = true\nrack = "r1"\nplan = false\ntrackers = ["http://10.0.0.1:6969/announce"]', "p2p",
     "needs p2p.rack, p2p.plan"),
    ('[p2p]\ncrossing = true\nrack = "r1"\ntrackers = ["http://10.0.0.1:6969/announce"]\ncrossing_port = 6881',
     "p2p", "must differ from the listen port"),
    ('[p2p]\ncrossing = true\nrack = "r1"\ntrackers = ["http://10.0.0.1:6969/announce"]\nlisten = "0.0.0.0:65535"',
     "p2p", "at most 65535, got 65536"),
    ('[p2p]\ncrossing_port = 70000', "p2p.crossing_port", "less than or equal"),
])
def test_bad_values_name_the_key(no_system_config: Path, tmp_path: Path, text: str, key: str, message: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(f, env=ENV)
    assert info.value.key == key
    assert message in str(info.value) and str(f) in str(info.value)


def test_a_crossing_session_on_an_ephemeral_or_given_port_is_accepted(no_system_config: Path, tmp_path: Path) -> None:
    from weightd.node.swarm import p2p_config
    f = tmp_path / "ok.toml"
    for listen, port, effective in (("0.0.0.0:0", 0, 0), ("0.0.0.0:6881", 0, 6882), ("[::]:6881", 7000, 7000)):
        f.write_text(f'[p2p]\ncrossing = true\nrack = "r1"\ntrackers = ["http://10.0.0.1:6969/announce"]\n'
                     f'listen = "{listen}"\ncrossing_port = {port}\n')
        cfg = p2p_config(load_config(f, env=ENV))
        assert cfg.crossing and cfg.crossing_listen[1] == effective


def test_broken_files(no_system_config: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml", env=ENV)
    (tmp_path / "broken.toml").write_text("[tiers\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(tmp_path / "broken.toml", env=ENV)
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, env=ENV)


def test_config_show(weightd, tmp_path: Path) -> None:
    proc = weightd("config", "show")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("# source: ")
    f = tmp_path / "c.toml"
    f.write_text('[tiers.hot]\ncapacity = "2GiB"\n')
    proc = weightd("--config", str(f), "config", "show", "--json")
    shown = json.loads(proc.stdout)
    assert shown["source"] == str(f) and shown["config"]["tiers"]["hot"]["capacity"] == 2 << 30
    # the printed TOML is itself a valid config that gives the same result
    toml_out = tmp_path / "shown.toml"
    toml_out.write_text(weightd("--config", str(f), "config", "show").stdout)
    again = json.loads(weightd("--config", str(toml_out), "config", "show", "--json").stdout)
    assert again["config"] == shown["config"]
