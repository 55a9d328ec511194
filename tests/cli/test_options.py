"""The worker's flags: defaults from Settings only, one unit-suffix convention, original names as aliases."""

from __future__ import annotations

import dataclasses

import pytest

from plaita.cli.main import build_parser
from plaita.cli.options import WORKER_OPTIONS, settings_from_args
from plaita.config import Settings
from plaita.errors import ConfigError


def parse(*argv: str, env: dict[str, str] | None = None) -> Settings:
    args = build_parser(env or {}).parse_args(["worker", *argv])
    return settings_from_args(args)


def test_defaults_are_exactly_the_settings_defaults() -> None:
    """No flag carries a default of its own: a worker built from no flags equals Settings()."""
    got = dataclasses.asdict(parse(*[]))
    want = dataclasses.asdict(Settings())
    got.pop("consumer_name")
    want.pop("consumer_name")
    assert got == want


@pytest.mark.parametrize(
    ("old", "new", "field", "value"),
    [
        ("--lease-ttl-seconds", "--lease-ttl-s", "lease_ttl_s", 7.0),
        ("--registry-ttl", "--registry-ttl-s", "registry_ttl_s", 40.0),
        ("--heartbeat-interval", "--heartbeat-interval-s", "heartbeat_interval_s", 4.0),
    ],
)
def test_original_flag_names_are_aliases(old: str, new: str, field: str, value: float) -> None:
    assert getattr(parse(old, str(value)), field) == value
    assert getattr(parse(new, str(value)), field) == value


def test_every_flag_name_carries_its_unit() -> None:
    """Numeric time/size flags end in -ms, -s, -bytes or -mb (counts and ports excepted)."""
    unitless = {
        "--concurrency",
        "--prefetch",
        "--max-deliveries",
        "--max-crashes",
        "--max-tasks-per-child",
        "--dlq-max-len",
        "--slot",
        "--metrics-port",
    }
    for opt in WORKER_OPTIONS:
        if opt.kind in (int, float) and opt.flag not in unitless:
            assert opt.flag.endswith(("-ms", "-s", "-bytes", "-mb")), opt.flag


def test_environment_overrides_the_default_and_a_flag_overrides_the_environment() -> None:
    env = {"PLAITA_LEASE_TTL_SECONDS": "9", "PLAITA_CLAIM_MIN_IDLE_MS": "1234"}
    s = parse(env=env)
    assert (s.lease_ttl_s, s.claim_min_idle_ms) == (9.0, 1234)
    assert parse("--lease-ttl-s", "11", env=env).lease_ttl_s == 11.0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "abc"])
def test_non_finite_or_garbage_numbers_exit_2_with_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--drain-timeout-s", value)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--drain-timeout-s" in err[0]


@pytest.mark.parametrize("value", ["nan", "abc"])
def test_a_bad_version_wait_exits_2_with_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 3: ``--version-wait-s`` (default 1 h) is checked like every duration (a
    negative one is a ConfigError, which the CLI turns into exit 2 with its message)."""
    assert parse().version_wait_s == 3600.0 and parse("--version-wait-s", "90").version_wait_s == 90.0
    with pytest.raises(ConfigError, match="--version-wait-s must be within"):
        parse("--version-wait-s", "-1")
    with pytest.raises(SystemExit) as exc:
        parse("--version-wait-s", value)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--version-wait-s" in err[0]
