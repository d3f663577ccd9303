"""Choosing the backend by one setting (B1): ``[fermix_core.storage] url``, overridden by
``FERMIX_STORAGE_URL``; no URL is ``memory.db`` in the home. config.toml never holds a
password (refused, never echoed), and nothing fermix prints shows one. Litestream's
replication and restore refuse a PostgreSQL home; the doctor checks PostgreSQL through its
inspection and leaves ``memory.db``'s modes out; the status names the store.

The PostgreSQL cases run on the suite's own server (``postgres_db``, tests/pg_fixtures.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fermix.cli import EXIT_FAILURE, EXIT_USAGE, main
from fermix.cli.context import CommandContext
from fermix.cli.doctor_checks import diagnosis as doctor
from fermix.cli.server import status_rows
from fermix.clock import now_ms
from fermix.config import STORAGE_URL_ENV, Config, StorageConfig, load_config, validate_key
from fermix.embedding import LiteLLMEmbedder
from fermix.errors import ConfigError, ServiceError, StorageError
from fermix.home import Home
from fermix.runtime import indexing
from fermix.runtime.prompt_files import PromptFiles
from fermix.runtime.writer import Writer
from fermix.server import service, serving
from fermix.storage import open_storage
from fermix.storage.opening import describe, storage_url
from fermix.storage.passwords import without_password
from fermix.storage.sqlite.database import Database

SECRET = "s3cr3t-Pa55"
URL_KEY = "fermix_core.storage.url"


def _with_secret(url: str) -> str:
    """``postgresql:///db?host=...`` as ``postgresql://postgres:SECRET@/db?host=...``."""
    return url.replace("postgresql://", f"postgresql://postgres:{SECRET}@", 1)


def _write(home: Path, text: str) -> Path:
    path = home / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's environment names no storage URL, whatever the runner's does."""
    monkeypatch.delenv(STORAGE_URL_ENV, raising=False)


# -- the setting ---------------------------------------------------------------------------


def test_b1_no_storage_url_means_memory_db_in_the_home(home: Path, no_env_url: None) -> None:
    fermix_home = Home(home)
    assert Config().storage.url is None
    assert storage_url(Config()) is None
    db = open_storage(fermix_home, Config(), readers=1)
    try:
        assert isinstance(db, Database)
        assert not db.shared
        assert db.key == os.path.abspath(fermix_home.db_path)
    finally:
        db.close()
    assert fermix_home.db_path.is_file()
    assert describe(fermix_home, Config()) == f"sqlite {fermix_home.db_path}"


@pytest.mark.parametrize("text", ['url = ""', ""])
def test_b1_an_empty_or_missing_url_key_is_sqlite(home: Path, text: str) -> None:
    config = load_config(_write(home, f"[fermix_core.storage]\n{text}\n"))
    assert config.storage == StorageConfig(url=None)


def test_b1_a_postgresql_url_without_a_password_loads(home: Path) -> None:
    url = "postgresql://fermix@db.internal:5432/fermix?sslmode=require"
    config = load_config(_write(home, f'[fermix_core.storage]\nurl = "{url}"\n'))
    assert config.storage.url == url
    assert storage_url(config, {}) == url


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://fermix:{SECRET}@db.internal/fermix",
        f"postgres://fermix:{SECRET}@h1:5432,h2:5432/fermix",
        f"postgresql:///fermix?host=/run/pg&password={SECRET}",
        f"postgresql://db/fermix?sslmode=require&PASSWORD={SECRET}",
    ],
)
def test_b1_config_toml_refuses_a_url_with_a_password_and_never_echoes_it(
    home: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_write(home, f'[fermix_core.storage]\nurl = "{url}"\n'))
    assert URL_KEY in str(refused.value) and STORAGE_URL_ENV in str(refused.value)
    assert SECRET not in str(refused.value)
    capsys.readouterr()
    assert main(["config", "show"]) == EXIT_FAILURE
    assert main(["config", "get", URL_KEY]) == EXIT_FAILURE
    (home / "config.toml").unlink()
    assert main(["config", "set", URL_KEY, url]) == EXIT_USAGE
    said = capsys.readouterr()
    assert SECRET not in said.out + said.err
    assert "value not shown" in said.err
    assert not (home / "config.toml").exists()


@pytest.mark.parametrize(
    "value", ["mysql://fermix@db/fermix", "sqlite:///tmp/memory.db", "db.internal", " ", 5]
)
def test_b1_a_url_that_is_not_postgresql_is_refused_at_load(value: object) -> None:
    with pytest.raises(ConfigError, match=r"fermix_core\.storage\.url must be"):
        validate_key(URL_KEY, value)


def test_b1_the_environment_overrides_config_and_fermix_config_never_shows_it(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The password lives in FERMIX_STORAGE_URL; `fermix config` shows the file only."""
    _write(home, '[fermix_core.storage]\nurl = "postgresql://fermix@config-host/fermix"\n')
    secret_url = f"postgresql://fermix:{SECRET}@env-host/fermix"
    monkeypatch.setenv(STORAGE_URL_ENV, secret_url)
    config = load_config(home / "config.toml")
    assert storage_url(config) == secret_url
    assert describe(Home(home), config) == "postgresql://fermix@env-host/fermix"
    monkeypatch.setenv(STORAGE_URL_ENV, "")  # empty: as unset
    assert storage_url(config) == "postgresql://fermix@config-host/fermix"
    monkeypatch.setenv(STORAGE_URL_ENV, secret_url)
    capsys.readouterr()
    assert main(["config", "show"]) == 0
    assert main(["config", "show", "--json"]) == 0
    assert main(["config", "get", URL_KEY]) == 0
    shown = capsys.readouterr().out
    assert "config-host" in shown
    assert SECRET not in shown and "env-host" not in shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            f"postgresql://u:{SECRET}@h:5432/db?sslmode=require",
            "postgresql://u@h:5432/db?sslmode=require",
        ),
        (f"postgresql:///db?host=/run/pg&password={SECRET}", "postgresql:///db?host=/run/pg"),
        (f"postgresql://:{SECRET}@h/db", "postgresql://h/db"),
        (f"postgresql://u:{SECRET}@with@h/db", "postgresql://u@h/db"),
        ("postgresql://u@h1,h2/db", "postgresql://u@h1,h2/db"),
    ],
)
def test_b1_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert without_password(url) == shown


# -- opening ---------------------------------------------------------------------------------


def test_b1_an_environment_url_that_is_not_postgresql_is_a_clear_storage_error(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STORAGE_URL_ENV, f"mysql://fermix:{SECRET}@db/fermix")
    with pytest.raises(StorageError, match="must start with postgresql://") as refused:
        open_storage(Home(home), Config())
    assert SECRET not in str(refused.value)
    assert not Home(home).db_path.exists()


def test_b1_a_missing_postgres_extra_is_a_clear_storage_error(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without psycopg (``None`` in ``sys.modules`` makes its import fail, as when it is
    not installed) the PostgreSQL branch says which extra to install."""
    for name in [m for m in sys.modules if m.startswith("fermix.storage.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setenv(STORAGE_URL_ENV, "postgresql:///fermix")
    with pytest.raises(StorageError, match=r"pip install 'fermix\[postgres\]'"):
        open_storage(Home(home), Config())
    assert not Home(home).db_path.exists()


def test_b1_a_postgresql_url_opens_the_shared_store_and_no_memory_db(
    home: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fermix_home = Home(home)
    monkeypatch.setenv(STORAGE_URL_ENV, postgres_db)
    ctx = CommandContext(fermix_home)
    try:
        db = ctx.db()
        assert db.shared
        assert db.key.startswith("postgresql:")
        with db.read() as reads:
            assert reads.conversations() == []
    finally:
        ctx.close()
    assert not fermix_home.db_path.exists()


def test_b1_the_embedder_registry_finds_a_sqlite_store_through_a_symbolic_link(
    tmp_path: Path, no_env_url: None
) -> None:
    """The registry is keyed by the port's ``key``; a search finds it by its session's name
    of the same store, which SQLite resolves through links."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    home = Home(tmp_path / "link" / "home")
    db = open_storage(home, Config(), readers=1)
    indexer = indexing.Indexer(
        db, Writer(db, PromptFiles(home, db)), LiteLLMEmbedder("openai/e", api_base="http://x")
    )
    try:
        indexing.register(db, indexer)
        with db.read() as reads:
            assert indexing.active(reads) is indexer
        indexing.unregister(db, indexer)
        with db.read() as reads:
            assert indexing.active(reads) is None
    finally:
        indexing.unregister(db, indexer)
        db.close()


# -- SQLite only: Litestream ------------------------------------------------------------------


def test_b1_restore_from_a_replica_is_refused_on_postgresql(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(home, '[fermix_core.replica]\nurl = "file:///var/backups/fermix"\n')
    monkeypatch.setenv(STORAGE_URL_ENV, f"postgresql://fermix:{SECRET}@db/fermix")
    assert main(["restore", "--from-replica"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "PostgreSQL (postgresql://fermix@db/fermix)" in err
    assert "pg_basebackup" in err and SECRET not in err
    assert not Home(home).db_path.exists()


def test_b1_the_server_refuses_litestream_on_postgresql_before_starting_anything(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(home, '[fermix_core.replica]\nurl = "file:///var/backups/fermix"\n')
    monkeypatch.setenv(STORAGE_URL_ENV, "postgresql://fermix@db.invalid/fermix")
    fermix_home = Home(home)
    with pytest.raises(ServiceError, match=r"replication \(\[fermix_core\.replica\] url\)"):
        serving.serve(fermix_home)
    assert not service.ServicePaths.of(fermix_home).pid.exists()
    assert not (home / "litestream.yml").exists()


def test_b1_the_status_table_names_the_store() -> None:
    rows = dict(status_rows({"pid": 7, "storage": "postgresql://fermix@db/fermix"}, now=0.0))
    assert rows["storage"] == "postgresql://fermix@db/fermix"


# -- the doctor on PostgreSQL -----------------------------------------------------------------


def test_b1_the_doctor_inspects_postgresql_and_leaves_memory_db_modes_out(
    home: Path, postgres_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty database: migrations pending (a warning, nothing changed); ``--fix``
    migrates it, creates no memory.db, and the checks then pass. A loose memory.db left
    in the home is not the memory's, so the permissions check does not name it."""
    fermix_home = Home(home)
    monkeypatch.setenv(STORAGE_URL_ENV, postgres_db)
    stray = fermix_home.db_path
    stray.write_bytes(b"")
    stray.chmod(0o644)

    report = doctor.diagnose(fermix_home, now=now_ms())
    checks = {c.name: c for c in report.checks}
    assert checks["database"].status == "warn" and checks["database"].fix == "migrate"
    assert "pending" in checks["database"].summary
    assert checks["permissions"].status == "pass"

    fixed = doctor.diagnose(fermix_home, now=now_ms(), fix=True)
    after = {c.name: c for c in fixed.checks}
    assert any("applied migrations" in line for line in fixed.fixed)
    assert after["database"].status == "pass"
    assert "PostgreSQL database" in after["database"].summary
    assert [(c.name, c.summary) for c in fixed.checks if c.status == "fail"] == []
    assert stray.stat().st_size == 0 and stray.stat().st_mode & 0o777 == 0o644


def test_b1_the_doctor_names_an_unreachable_postgresql_without_its_password(
    home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"postgresql://fermix:{SECRET}@/fermix?host={tmp_path}/no-server&connect_timeout=2"
    monkeypatch.setenv(STORAGE_URL_ENV, url)
    check = {c.name: c for c in doctor.diagnose(Home(home), now=now_ms()).checks}["database"]
    assert check.status == "fail"
    assert STORAGE_URL_ENV in check.hint
    assert SECRET not in check.summary + check.hint


def test_b1_doctor_fix_leaves_the_store_alone_while_config_toml_does_not_load(
    home: Path, no_env_url: None
) -> None:
    """A config.toml that does not load may name a PostgreSQL database: ``--fix`` then
    creates no memory.db in its place, and says why."""
    _write(home, '[fermix_core.storage]\nurl = "postgresql://fermix@db/fermix"\nbogus = 1\n')
    report = doctor.diagnose(Home(home), now=now_ms(), fix=True)
    assert any("config.toml does not load" in line for line in report.fixed)
    assert not Home(home).db_path.exists()
