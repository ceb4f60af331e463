"""Where poolctl finds the server and the token: the environment wins over the TOML file."""

import os

import pytest

from poolctl.config import ConfigError, load


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('url = "https://pool.example/api/v1/"\ntoken = "cpu_from_file"\npool = "lab"\n')
    path.chmod(0o600)
    return path


def test_the_file_is_read_when_the_environment_says_nothing(config_file, capsys):
    config = load({"POOLCTL_CONFIG": str(config_file)})
    assert (config.url, config.token, config.pool) == (
        "https://pool.example",
        "cpu_from_file",
        "lab",
    )
    assert config.api == "https://pool.example/api/v1"  # either form of the URL is accepted
    assert config.tenant == "" and config.timeout == 30
    assert capsys.readouterr().err == ""


def test_the_environment_wins(config_file):
    environ = {
        "POOLCTL_CONFIG": str(config_file),
        "POOLCTL_TOKEN": "cpu_from_env",
        "POOLCTL_TENANT": "vision",
    }
    config = load(environ)
    assert (config.url, config.token, config.tenant) == (
        "https://pool.example",
        "cpu_from_env",
        "vision",
    )


def test_without_a_file_the_environment_alone_is_enough(tmp_path):
    environ = {"POOLCTL_CONFIG": str(tmp_path / "none.toml"), "POOLCTL_URL": "http://h:8000"}
    with pytest.raises(ConfigError, match="no token: set POOLCTL_TOKEN"):
        load(environ)
    assert load(environ | {"POOLCTL_TOKEN": "t"}).url == "http://h:8000"


def test_the_default_path_is_under_the_home_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / ".config" / "poolctl" / "config.toml"
    path.parent.mkdir(parents=True)
    path.write_text('url = "http://127.0.0.1:8000"\ntoken = "cpu_home"\n')
    path.chmod(0o600)
    assert load({}).token == "cpu_home"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('url = "http://h"\ntoken = "t"\ntokn = "x"\n', "unknown key"),
        ("url = \n", "cannot read"),
        ('url = "ftp://h"\ntoken = "t"\n', "must start with http:// or https://"),
        ('url = "http://h"\ntoken = "t"\ntimeout = "soon"\n', "timeout must be a number"),
        ('url = "http://h"\ntoken = 5\n', "no token"),
    ],
)
def test_a_bad_file_is_a_config_error(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=message):
        load({"POOLCTL_CONFIG": str(path)})


def test_a_token_file_others_may_read_is_warned_about(config_file, capsys):
    os.chmod(config_file, 0o644)
    load({"POOLCTL_CONFIG": str(config_file)})
    assert "others may read it" in capsys.readouterr().err
