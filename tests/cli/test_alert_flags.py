"""``--alert-webhook`` / ``PLAITA_ALERT_WEBHOOK`` (worker and keeper), ``--alert-backoff-s`` and the
secret from ``PLAITA_ALERT_WEBHOOK_SECRET`` only: parsed into Settings, bad values exit 2 with one
line that never shows the URL's token, and the secret stays out of the Settings repr."""

from __future__ import annotations

import pytest

from plaita.cli.main import build_parser, main
from plaita.cli.options import settings_from_args
from plaita.config import Settings


def parse(*argv: str, env: dict[str, str] | None = None) -> Settings:
    return settings_from_args(build_parser(env or {}).parse_args(["worker", *argv]))


def test_off_by_default() -> None:
    s = parse()
    assert s.alert_webhook is None and s.alert_webhook_secret is None and s.alert_backoff_s == 30.0


def test_flag_environment_and_secret() -> None:
    env = {
        "PLAITA_ALERT_WEBHOOK": "https://hooks.example.com/a",
        "PLAITA_ALERT_WEBHOOK_SECRET": "k3y",
        "PLAITA_ALERT_BACKOFF_S": "12",
    }
    s = parse(env=env)
    assert (s.alert_webhook, s.alert_webhook_secret, s.alert_backoff_s) == ("https://hooks.example.com/a", "k3y", 12.0)
    assert parse("--alert-webhook", "http://127.0.0.1:9/b", env=env).alert_webhook == "http://127.0.0.1:9/b"
    assert "k3y" not in repr(s)


def test_the_secret_is_no_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("--alert-webhook-secret", "x")
    assert exc.value.code == 2
    capsys.readouterr()


@pytest.mark.parametrize("command", ["worker", "keeper"])
def test_help_names_the_flag(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser({}).parse_args([command, "--help"])
    out = capsys.readouterr().out
    assert "--alert-webhook" in out and "PLAITA_ALERT_WEBHOOK" in out
    assert ("--alert-backoff-s" in out) is (command == "worker")


@pytest.mark.parametrize("command", ["worker", "keeper"])
def test_bad_url_exits_2_without_the_token(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["--handler", "plaita.runtime.handlers:echo"] if command == "worker" else ["--once"]
    code = main([command, "--redis-url", "redis://127.0.0.1:1/0", "--alert-webhook", "ftp://h/T0KEN", *extra])
    err = capsys.readouterr().err
    assert code == 2 and "--alert-webhook" in err and "T0KEN" not in err
    assert len(err.strip().splitlines()) == 1


def test_backoff_threshold_is_checked(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["worker", "--alert-backoff-s", "0", "--handler", "plaita.runtime.handlers:echo"])
    err = capsys.readouterr().err
    assert code == 2 and "--alert-backoff-s" in err
