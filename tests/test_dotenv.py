"""`.env` files (`settings.load_env_file`): flags > process environment > `.env` > defaults, the
same messages naming the variable (and the file it came from), and no value ever printed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amapreduce.cli.app import main
from amapreduce.errors import ConfigError
from amapreduce.settings import ENV_FILE_VARIABLE, load_env_file, load_settings


@pytest.fixture(autouse=True)
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory and a private copy of `os.environ`, since reading `.env` exports
    its variables into the process environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "environ", dict(os.environ))
    os.environ.pop(ENV_FILE_VARIABLE, None)
    for name in ("ANTHROPIC_API_KEY", "SERPER_API_KEY"):
        os.environ.pop(name, None)
    return tmp_path


def test_dot_env_sits_between_the_environment_and_the_defaults(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text(
        "# settings for this folder\nAMAPREDUCE_WORKERS=3\nexport AMAPREDUCE_MAX_ATTEMPTS=5\n"
        'AMAPREDUCE_SEARCH_BACKEND="searxng:http://127.0.0.1:8888"\nAMAPREDUCE_PATCH_ROUNDS=1\n',
        encoding="utf-8",
    )
    os.environ["AMAPREDUCE_MAX_ATTEMPTS"] = "2"  # the process environment beats the file
    settings = load_settings(patch_rounds=0)  # and a flag beats both
    assert (settings.workers, settings.max_attempts, settings.patch_rounds) == (3, 2, 0)
    assert settings.search_backend == "searxng:http://127.0.0.1:8888"
    assert settings.batch_timeout_s == 900.0  # the default, set nowhere
    # An explicit environment is read as given: no file.
    assert load_settings({}).workers == 8


def test_dot_env_keys_reach_the_process_without_replacing_it(tmp_path: Path) -> None:
    """Provider libraries (LiteLLM) read their keys from the process environment themselves."""
    (tmp_path / ".env").write_text("ANTHROPIC_API_KEY=sk-ant-from-file-0123\nSERPER_API_KEY=serper-from-file-0123\n",
                                   encoding="utf-8")
    os.environ["SERPER_API_KEY"] = "serper-from-shell-0123"
    settings = load_settings()
    assert os.environ["ANTHROPIC_API_KEY"] == "sk-ant-from-file-0123"
    assert os.environ["SERPER_API_KEY"] == "serper-from-shell-0123"
    assert settings.serper_api_key is not None and settings.serper_api_key.get_secret_value() == "serper-from-shell-0123"
    assert "sk-ant-from-file-0123" in settings.secret_values()  # registered for redaction like the shell's


def test_the_variable_names_another_file(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("AMAPREDUCE_WORKERS=3\n", encoding="utf-8")
    (tmp_path / "prod.env").write_text("AMAPREDUCE_WORKERS=12\n", encoding="utf-8")
    os.environ[ENV_FILE_VARIABLE] = str(tmp_path / "prod.env")
    assert load_settings().workers == 12
    os.environ[ENV_FILE_VARIABLE] = os.devnull  # no file at all
    os.environ.pop("AMAPREDUCE_WORKERS")  # exported by the load above
    assert load_env_file() == (Path(os.devnull), {}) and load_settings().workers == 8
    os.environ[ENV_FILE_VARIABLE] = str(tmp_path / "missing.env")
    with pytest.raises(ConfigError, match=rf"`{ENV_FILE_VARIABLE}` names '.*missing.env', which does not exist"):
        load_settings()


def test_no_file_is_fine(tmp_path: Path) -> None:
    assert load_env_file() == (None, {})
    assert load_settings().workers == 8


def test_a_bad_value_names_the_variable_and_the_file(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("AMAPREDUCE_WORKERS=many\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^`AMAPREDUCE_WORKERS` \(set in '.env'\) is invalid \(setting `workers`\): "
                                          r"Input should be a valid integer.*got 'many'"):
        load_settings()
    os.environ["AMAPREDUCE_WORKERS"] = "lots"  # from the shell: the message is today's
    with pytest.raises(ConfigError, match=r"^`AMAPREDUCE_WORKERS` is invalid \(setting `workers`\): .*got 'lots'"):
        load_settings()


def test_a_line_that_does_not_parse_is_named_without_its_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-secret-0123456789\nthis is sk-secret-0123456789 not a line\n",
                                   encoding="utf-8")
    assert main(["mapreduce", "plan", "missing.json"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: '.env' line 2 is not a `NAME=value` line. Fix or remove it (quote values with spaces or #)."
    assert "sk-secret" not in err


def test_the_cli_reads_dot_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".env").write_text("AMAPREDUCE_MAX_BATCHES=0\nOPENAI_API_KEY=sk-secret-0123456789\n", encoding="utf-8")
    (tmp_path / "d.json").write_text('{"task_matrix": [["a"]], "template": "__0__", "json_schema": ["a"]}', encoding="utf-8")
    assert main(["mapreduce", "plan", "d.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `AMAPREDUCE_MAX_BATCHES` (set in '.env') is invalid (setting `max_batches`)")
    assert len(err.strip().splitlines()) == 1 and "sk-secret" not in err
