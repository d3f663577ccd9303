"""fermix as Hermes Agent's memory provider, and ``fermix hermes install`` (I1).

The quick tests run here, in fermix's venv: the install command, the settings file, the
mapping of a Hermes turn onto fermix's appends. The others run Hermes itself: its pinned
dependencies (openai 2.x among them) clash with this venv's, so ``bin/venv-hermes`` makes
its own venv (hermes-agent 0.19.0 and this checkout's fermix, built as a wheel), and each
test runs a Python in it as a subprocess. That Python installs the plugin with the venv's
own ``fermix hermes install``, selects it with Hermes's own ``hermes config set``, loads it
through Hermes's plugin discovery (``plugins.memory.load_memory_provider``) and runs
Hermes's agent loop (``AIAgent.run_conversation``, which streams every model call) against
the loopback model server of this process, then ends the session
(``shutdown_memory_provider``). The test then reads what fermix kept, in the same home
(embedded) or through a real memory server (remote). In CI (``CI=true``) a venv that cannot
be made fails these tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from docs_page import section
from factories import config_for
from model_server import ModelServer
from server_fixtures import ServerProcess, StartServer

from fermix.api import Memory
from fermix.cli import EXIT_FAILURE, EXIT_OK, main
from fermix.core.composer import FENCE_OPEN, LABEL
from fermix.errors import ConfigError, InvalidInputError
from fermix.integrations.hermes import install as installing
from fermix.integrations.hermes import settings, turns
from fermix.model import Message

ROOT = Path(__file__).resolve().parents[2]
HERMES_MODEL = "hermes-model"
"""The model Hermes's own calls name: the model server routes its steps by it."""
REVIEWER = "fermix-reviewer"
"""The model of fermix's reviewer (``openai/fermix-reviewer``), routed apart."""
VENV_S = 600
RUN_S = 180

# -- the install command ---------------------------------------------------------------


def test_i1_install_writes_the_plugin_hermes_discovers_and_again_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """I1: ``fermix hermes install`` writes plugin.yaml and an __init__.py that Hermes's
    discovery takes for a memory provider (it scans for ``MemoryProvider``), then tells
    how to select it; a second run leaves the files as they are."""
    hermes_home = tmp_path / "hermes"
    assert main(["hermes", "install", "--hermes-home", str(hermes_home)]) == EXIT_OK
    out = capsys.readouterr().out
    folder = hermes_home / "plugins" / "fermix"
    init = (folder / "__init__.py").read_text("utf-8")
    assert "MemoryProvider" in init[:8192] and "register" in init
    assert "from fermix.integrations.hermes.provider import" in init
    assert (folder / "plugin.yaml").read_text("utf-8").startswith("name: fermix\n")
    assert "installed" in out and "hermes config set memory.provider fermix" in out
    assert "provider: fermix" in out
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}

    assert main(["hermes", "install", "--hermes-home", str(hermes_home)]) == EXIT_OK
    assert "unchanged" in capsys.readouterr().out
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before


def test_i1_install_refuses_a_folder_it_did_not_write_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """I1: another plugins/fermix is left untouched (exit 1, saying --force), and
    replaced with --force; a stray module in our own folder is removed (Hermes would
    run it)."""
    hermes_home = tmp_path / "hermes"
    foreign = hermes_home / "plugins" / "fermix"
    foreign.mkdir(parents=True)
    (foreign / "__init__.py").write_text("class Theirs: ...\n", "utf-8")
    argv = ["hermes", "install", "--hermes-home", str(hermes_home)]
    assert main(argv) == EXIT_FAILURE
    assert "--force" in capsys.readouterr().err
    assert (foreign / "__init__.py").read_text("utf-8") == "class Theirs: ...\n"

    assert main([*argv, "--force"]) == EXIT_OK
    assert "replaced" in capsys.readouterr().out
    assert installing.is_ours(foreign)
    (foreign / "stray.py").write_text("raise SystemExit\n", "utf-8")
    assert main(argv) == EXIT_OK
    assert sorted(p.name for p in foreign.iterdir()) == ["__init__.py", "plugin.yaml"]


def test_i1_install_defaults_to_hermes_home_as_hermes_resolves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """I1: ``$HERMES_HOME`` when set, else ``~/.hermes`` (hermes_constants.get_hermes_home)."""
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "from-env"))
    assert main(["hermes", "install"]) == EXIT_OK
    assert installing.is_ours(tmp_path / "from-env" / "plugins" / "fermix")
    monkeypatch.delenv("HERMES_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert installing.default_hermes_home() == tmp_path / "user" / ".hermes"
    with pytest.raises(InvalidInputError):
        installing.install(" ")


# -- the settings --------------------------------------------------------------------------


def test_i1_save_config_writes_owner_only_and_the_token_is_never_shown(tmp_path: Path) -> None:
    """I1: ``save_config``'s file is 0600 and merged; the token (a secret) stays out of
    the settings' repr; ``FERMIX_TOKEN`` wins over a saved one."""
    path = settings.save({"mode": "server", "url": "http://127.0.0.1:9/"}, tmp_path)
    settings.save({"token": "fmx_secret_value", "agent_id": "assistant"}, tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = settings.load(tmp_path, environ={})
    assert (loaded.mode, loaded.url, loaded.agent_id) == (
        "server",
        "http://127.0.0.1:9",
        "assistant",
    )
    assert loaded.ready and loaded.token == "fmx_secret_value"
    assert "fmx_secret_value" not in repr(loaded)
    assert settings.load(tmp_path, environ={"FERMIX_TOKEN": "fmx_env"}).token == "fmx_env"
    schema = {field["key"]: field for field in settings.config_schema()}
    assert schema["token"]["secret"] and schema["token"]["env_var"] == "FERMIX_TOKEN"
    assert schema["mode"]["choices"] == ["embedded", "server"]


@pytest.mark.parametrize(
    "values",
    [{"mode": "remote"}, {"colour": "blue"}, {"url": "ftp://x"}, {"owner_id": "a\x01b"}],
    ids=["bad mode", "unknown key", "bad url", "control character"],
)
def test_i1_bad_settings_are_refused_and_nothing_is_written(
    tmp_path: Path, values: dict[str, str]
) -> None:
    """I1: a bad value is an InvalidInputError naming it; the file is not touched."""
    path = settings.save({"owner_id": "ana"}, tmp_path)
    before = path.read_bytes()
    with pytest.raises(InvalidInputError):
        settings.save(values, tmp_path)
    assert path.read_bytes() == before


def test_i1_a_broken_settings_file_is_a_config_error_and_none_is_embedded(tmp_path: Path) -> None:
    """I1: no file is embedded on fermix's default home; unreadable JSON a ConfigError."""
    default = settings.load(tmp_path, environ={})
    assert default.embedded and default.ready and default.agent_id == "hermes"
    settings.path_in(tmp_path).write_text("{not json", "utf-8")
    with pytest.raises(ConfigError):
        settings.load(tmp_path, environ={})
    settings.path_in(tmp_path).write_text('{"mode": "server"}', "utf-8")
    assert not settings.load(tmp_path, environ={}).ready  # a server needs url and token


# -- a Hermes turn as fermix appends ---------------------------------------------------------

TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You are Hermes."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": [{"type": "text", "text": "Remember my flight"}]},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_9",
                "type": "function",
                "function": {"name": "memory_store", "arguments": {"key": "flight"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_9", "content": '{"stored": {}}'},
    {"role": "assistant", "content": "Stored."},
]


def test_i1_a_turn_becomes_the_appends_a_hand_written_host_makes() -> None:
    """I1: the last user message and what follows: the tool call in metadata, the tool
    result with its call id and name (found from the call), the reply for the commit;
    the same turn gets the same client keys, another turn others."""
    turn = turns.build("s1", "Remember my flight", "Stored.", TURN)
    assert [(s.role, s.text) for s in turn.steps] == [
        ("user", "Remember my flight"),
        ("assistant", ""),
        ("tool", '{"stored": {}}'),
    ]
    call = turn.steps[1].metadata["tool_calls"][0]
    assert call["function"] == {"name": "memory_store", "arguments": '{"key": "flight"}'}
    assert turn.steps[2].metadata == {"tool_call_id": "call_9", "name": "memory_store"}
    assert turn.reply == "Stored."
    again = turns.completed("s1", TURN, "Remember my flight")
    assert again is not None and again.ident == turn.ident and again.steps == turn.steps
    assert turns.build("s1", "Hi", "Hello", TURN[:3]).ident != turn.ident
    assert turns.completed("s1", TURN[:-1], "Remember my flight") is None  # still in tools
    assert len(turn.key(3)) <= 200


# -- Hermes itself, in its own venv ------------------------------------------------------------


@pytest.fixture(scope="module")
def hermes_venv() -> Path:
    """The venv ``bin/venv-hermes`` makes (or finds up to date): its path."""
    made = subprocess.run(
        [str(ROOT / "bin" / "venv-hermes")], capture_output=True, text=True, timeout=VENV_S
    )
    if made.returncode != 0:
        why = f"bin/venv-hermes failed:\n{made.stderr[-3000:]}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return Path(made.stdout.strip().splitlines()[-1])


@pytest.fixture
def hermes_home(tmp_path: Path) -> Path:
    """An empty Hermes home (``HERMES_HOME``)."""
    folder = tmp_path / "hermes"
    folder.mkdir()
    return folder


def _env(hermes_home: Path, model_server: ModelServer, **extra: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": str(hermes_home.parent),
        "HERMES_HOME": str(hermes_home),
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": model_server.url,
        "OPENAI_API_BASE": model_server.url,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


def _install(venv: Path, env: dict[str, str]) -> None:
    """The install steps as the docs give them, with the venv's own commands."""
    for argv in (
        [str(venv / "bin" / "fermix"), "hermes", "install"],
        [str(venv / "bin" / "hermes"), "config", "set", "memory.provider", "fermix"],
    ):
        done = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=RUN_S, stdin=subprocess.DEVNULL
        )
        assert done.returncode == 0, done.stdout + done.stderr


DRIVER = r"""
import json, sys

spec = json.loads(sys.argv[1])
from plugins.memory import discover_memory_providers, load_memory_provider

provider = load_memory_provider("fermix")
plugin = sys.modules.get("_hermes_user_memory.fermix")
out = {
    "discovered": [[name, available] for name, _, available in discover_memory_providers()],
    "class": f"{type(provider).__module__}.{type(provider).__qualname__}",
    "plugin_file": getattr(plugin, "__file__", None),
    "backup_paths": provider.backup_paths(),
    "runs": [],
}
from run_agent import AIAgent

for run in spec["runs"]:
    agent = AIAgent(
        base_url=spec["base_url"], api_key="sk-test", model=spec["model"], quiet_mode=True,
        enabled_toolsets=["memory"], skip_context_files=True, max_iterations=6,
        **run.get("agent", {}),
    )
    result = agent.run_conversation(run["message"])
    done = {"reply": result["final_response"], "session_id": agent.session_id}
    if run.get("compress"):
        # What Hermes's compressor asks first, through Hermes's own MemoryManager.
        from agent.memory_manager import MemoryManager

        manager = MemoryManager()
        manager.add_provider(load_memory_provider("fermix"))
        manager.initialize_all(session_id=agent.session_id, platform="cli", agent_context="primary")
        done["pre_compress"] = manager.on_pre_compress(result["messages"])
        manager.shutdown_all()
    agent.shutdown_memory_provider(result["messages"])
    out["runs"].append(done)
print(json.dumps(out))
"""


def _drive(
    venv: Path, env: dict[str, str], model_server: ModelServer, *runs: dict[str, Any]
) -> Any:
    spec = {"base_url": model_server.url, "model": HERMES_MODEL, "runs": list(runs)}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", DRIVER, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _requests(model_server: ModelServer, model: str) -> list[dict[str, Any]]:
    return [r for r in model_server.requests if r.get("model") == model]


def _review_ops(*facts: tuple[str, str, str]) -> dict[str, Any]:
    return {"operations": [{"op": "add", "category": c, "key": k, "value": v} for c, k, v in facts]}


@pytest.fixture
def seeded(model_server: ModelServer, home: Path) -> Path:
    """A fermix home where a review has put Ana's job in her USER.md (agent ``hermes``),
    closed before Hermes opens it; background reviews off (only forced ones run)."""
    (home / "config.toml").write_text(
        "[fermix_core.memory]\nreview_interval_hours = 0\n", encoding="utf-8"
    )
    with Memory(home, config=config_for(model_server)) as memory:
        conv = memory.conversation("hermes", "seed", "seed", owner_id="ana")
        conv.append_user("I am a nurse in Porto.")
        model_server.reply_json(_review_ops(("identity", "job", "Ana is a nurse in Porto")))
        assert memory.review(conv).status == "applied"
        assert "nurse in Porto" in conv.memory_files()[0]
    model_server.requests.clear()
    return home


def _history(memory: Memory, key: tuple[str, str, str]) -> list[Message]:
    return memory.conversation(*key).history()


@pytest.mark.slow  # a venv (once), then Hermes in a subprocess
def test_i1_a_hermes_turn_lands_in_fermix_with_its_speaker_its_prompt_block_and_tools(
    hermes_venv: Path,
    hermes_home: Path,
    seeded: Path,
    model_server: ModelServer,
    start_memory: Any,
) -> None:
    """I1, M1, M2: Hermes's own discovery loads the installed plugin; the system prompt
    it sends holds fermix's memory block (Ana's USER.md) and the user message the recall
    prefetch; the model's memory_store runs in fermix and its result is in the next
    request; the turn is stored once, as a guest's (trust never asked for); the session's
    end makes fermix review it (the reviewer's call reaches the model server)."""
    env = _env(hermes_home, model_server)
    _install(hermes_venv, env)
    settings.save(
        {
            "home": str(seeded),
            "owner_id": "ana",
            "model": f"openai/{REVIEWER}",
            "api_base": model_server.url,
        },
        hermes_home,
    )
    model_server.reply_tool_call(
        "memory_store", {"key": "flight", "value": "TAP 1234 on May 1st"}, for_model=HERMES_MODEL
    )
    model_server.reply("Noted, Ana: TAP 1234.", for_model=HERMES_MODEL)
    model_server.reply_json(
        _review_ops(("goal", "trip", "Ana flies to Porto next week")), for_model=REVIEWER
    )

    out = _drive(
        hermes_venv, env, model_server, {"message": "I'm flying to Porto next week on TAP 1234."}
    )

    assert ["fermix", True] in out["discovered"]
    assert out["class"] == "fermix.integrations.hermes.provider.FermixMemoryProvider"
    assert out["plugin_file"] == str(hermes_home / "plugins" / "fermix" / "__init__.py")
    assert out["backup_paths"] == [str(seeded)]
    assert out["runs"][0]["reply"] == "Noted, Ana: TAP 1234."

    first, second = _requests(model_server, HERMES_MODEL)
    system = first["messages"][0]["content"]
    assert "# fermix memory" in system and LABEL in system and FENCE_OPEN in system
    assert "Ana is a nurse in Porto" in system
    assert {"memory_store", "memory_recall", "memory_sources_list"} <= {
        t["function"]["name"] for t in first["tools"]
    }
    asked = first["messages"][-1]["content"]
    assert "## fermix recall" in asked and "nurse in Porto" in asked
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool"
    assert json.loads(tool_message["content"])["stored"]["value"] == "TAP 1234 on May 1st"

    (review,) = _requests(model_server, REVIEWER)
    assert "TAP 1234" in json.dumps(review["messages"])

    session = out["runs"][0]["session_id"]
    memory: Memory = start_memory(home=seeded)
    stored = _history(memory, ("hermes", "cli", session))
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    assert all(m.owner_id == "ana" and m.trust == "guest" for m in stored)
    assert stored[0].sender == "ana" and "TAP 1234" in stored[0].content
    assert stored[1].metadata["tool_calls"][0]["function"]["name"] == "memory_store"
    assert stored[2].metadata["name"] == "memory_store"
    assert stored[3].content == "Noted, Ana: TAP 1234."
    rows = memory.list_rows(agent_id="hermes", owner_id="ana")
    assert {"flight", "trip"} <= {r.key for r in rows}


@pytest.mark.slow  # Hermes in a subprocess
def test_i1_a_gateway_user_stays_a_guest_while_the_configured_cli_owner_is_operator(
    hermes_venv: Path, hermes_home: Path, seeded: Path, model_server: ModelServer, start_memory: Any
) -> None:
    """I1, M2: config.toml names Ana an operator, so her CLI session is hers at operator
    trust; a Telegram user of the same Hermes process (one shared Memory) is its own
    owner and a guest, in its chat's conversation, though the settings' owner is Ana."""
    (seeded / "config.toml").write_text(
        "[fermix_core.memory]\nreview_interval_hours = 0\n"
        '[fermix_core.security]\noperators = ["ana"]\n',
        encoding="utf-8",
    )
    env = _env(hermes_home, model_server)
    _install(hermes_venv, env)
    settings.save({"home": str(seeded), "owner_id": "ana"}, hermes_home)
    model_server.reply("Hello Ana.", for_model=HERMES_MODEL)
    model_server.reply("Hello Bob.", for_model=HERMES_MODEL)
    gateway = {"platform": "telegram", "user_id": "bob", "chat_id": "group-7", "chat_type": "group"}

    out = _drive(
        hermes_venv,
        env,
        model_server,
        {"message": "Hi, it's Ana."},
        {"message": "I'm Bob and I like tea.", "agent": gateway},
    )

    assert [r["reply"] for r in out["runs"]] == ["Hello Ana.", "Hello Bob."]
    memory: Memory = start_memory(home=seeded)
    ana = _history(memory, ("hermes", "cli", out["runs"][0]["session_id"]))
    bob = _history(memory, ("hermes", "telegram", "group-7"))
    assert [(m.role, m.owner_id, m.trust) for m in ana] == [
        ("user", "ana", "operator"),
        ("assistant", "ana", "operator"),
    ]
    assert [(m.role, m.owner_id, m.trust) for m in bob] == [
        ("user", "bob", "guest"),
        ("assistant", "bob", "guest"),
    ]


@pytest.mark.slow  # a memory server process, then Hermes in a subprocess
def test_i1_the_provider_runs_against_the_memory_server_with_a_host_token(
    hermes_venv: Path, hermes_home: Path, model_server: ModelServer, start_server: StartServer
) -> None:
    """I1, N2: in server mode the turn goes through fermix.Client to a real server as a
    guest's (a host token's), the session's end reviews it there (the server's reviewer
    calls the model server), and the token, given in FERMIX_TOKEN, is in no Hermes log."""
    server: ServerProcess = start_server(
        f'[fermix_core.model]\nprimary = "openai/{REVIEWER}"\napi_base = "{model_server.url}"\n'
        "[fermix_core.memory]\nreview_interval_hours = 0\n"
    )
    env = _env(hermes_home, model_server, FERMIX_TOKEN=server.host_token)
    _install(hermes_venv, env)
    settings.save(
        {"mode": "server", "url": server.url, "agent_id": "assistant", "owner_id": "ana"},
        hermes_home,
    )
    model_server.reply("Hello from Hermes.", for_model=HERMES_MODEL)
    model_server.reply_json(
        _review_ops(("preference", "drink", "Ana drinks tea")), for_model=REVIEWER
    )

    out = _drive(hermes_venv, env, model_server, {"message": "I always drink tea."})

    assert out["backup_paths"] == []  # the server's home is the server's to back up
    assert out["runs"][0]["reply"] == "Hello from Hermes."
    assert len(_requests(model_server, REVIEWER)) == 1
    conv = server.client(server.operator_token).conversation(
        "assistant", "cli", out["runs"][0]["session_id"], owner_id="ana"
    )
    assert [(m.role, m.owner_id, m.trust) for m in conv.history()] == [
        ("user", "ana", "guest"),
        ("assistant", "ana", "guest"),
    ]
    logs = [p for p in (hermes_home / "logs").rglob("*") if p.is_file()]
    assert logs, "Hermes wrote no log to look in"
    assert not any(server.host_token in p.read_text("utf-8", "replace") for p in logs)


def _docs_host() -> str:
    text = section("Hermes Agent (I1)")
    host = text[text.index("### A complete host") :]
    match = re.search(r"```python\n(.*?)```", host, re.DOTALL)
    assert match is not None
    return match.group(1)


@pytest.mark.slow  # Hermes in a subprocess
def test_i1_the_docs_host_runs_as_written(
    hermes_venv: Path, hermes_home: Path, home: Path, model_server: ModelServer, start_memory: Any
) -> None:
    """I1: the docs' install steps, then their host as written, run one Hermes turn on
    fermix's default home ($FERMIX_HOME): the model's tool call stores the job, the
    session's end reviews it."""
    env = _env(hermes_home, model_server, FERMIX_HOME=str(home), HERMES_MODEL=HERMES_MODEL)
    (home / "config.toml").write_text(
        f'[fermix_core.model]\nprimary = "openai/{REVIEWER}"\n'
        "[fermix_core.memory]\nreview_interval_hours = 0\n",
        encoding="utf-8",
    )
    _install(hermes_venv, env)
    model_server.reply_tool_call(
        "memory_store", {"key": "job", "value": "nurse in Porto"}, for_model=HERMES_MODEL
    )
    model_server.reply("Nice to meet you, Ana!", for_model=HERMES_MODEL)
    model_server.reply_json(_review_ops(("identity", "job", "Ana is a nurse")), for_model=REVIEWER)

    done = subprocess.run(
        [str(hermes_venv / "bin" / "python"), "-c", _docs_host()],
        capture_output=True,
        text=True,
        env=env,
        timeout=RUN_S,
        stdin=subprocess.DEVNULL,
    )

    assert done.returncode == 0, done.stderr[-6000:]
    assert "Nice to meet you, Ana!" in done.stdout
    assert len(_requests(model_server, REVIEWER)) == 1
    memory: Memory = start_memory(home=home)
    rows = memory.list_rows(agent_id="hermes")
    assert {("job", "nurse in Porto"), ("job", "Ana is a nurse")} <= {
        (r.key, r.value) for r in rows
    }


@pytest.mark.slow  # Hermes in a subprocess
def test_i1_hermes_compression_hands_the_conversation_to_fermix_compaction(
    hermes_venv: Path, hermes_home: Path, seeded: Path, model_server: ModelServer, start_memory: Any
) -> None:
    """I1, K2: before Hermes compresses, its MemoryManager's on_pre_compress makes fermix
    compact the conversation (forced: the compactor's call reaches the model server) and
    hands fermix's summary back for Hermes's compression prompt."""
    (seeded / "config.toml").write_text(
        "[fermix_core.memory]\nreview_interval_hours = 0\n"
        f'[fermix_core.model]\nprimary = "openai/{REVIEWER}"\napi_base = "{model_server.url}"\n'
        "context_window = 1000\n",  # the long message does not fit: it is summarized
        encoding="utf-8",
    )
    env = _env(hermes_home, model_server)
    _install(hermes_venv, env)
    settings.save({"home": str(seeded), "owner_id": "ana"}, hermes_home)
    model_server.reply("Porto has a lovely harbour.", for_model=HERMES_MODEL)
    model_server.reply("Ana asked about the harbour in Porto.", for_model=REVIEWER)
    model_server.reply_json(_review_ops(), for_model=REVIEWER)

    out = _drive(
        hermes_venv,
        env,
        model_server,
        {"message": "Tell me about the harbour in Porto: " + "its boats, " * 300, "compress": True},
    )

    summary = out["runs"][0]["pre_compress"]
    assert "Ana asked about the harbour in Porto." in summary
    compaction = _requests(model_server, REVIEWER)[0]
    assert "harbour in Porto" in json.dumps(compaction["messages"])
    memory: Memory = start_memory(home=seeded)
    window = _history(memory, ("hermes", "cli", out["runs"][0]["session_id"]))
    assert window[0].kind == "checkpoint"
