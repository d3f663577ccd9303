"""The operator's routes of the memory server: rows, resources, jobs, voice, status (N1, N2).

Most cases run the app in this process (``TestClient``) over one started ``Memory`` on a
real SQLite home another process seeded; the last section runs a real server process and
talks to it through ``fermix.Client`` (N4). Every agent-scoped route needs a token for its
agent; another agent's row, job or run answers 404 like a missing one, so a token cannot
learn what exists (N2); restore and rollback need an operator token, and a host token's
attempt changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from factories import fact, other_process, reading
from fastapi.testclient import TestClient
from server_fixtures import ServerProcess

from fermix.api import Memory
from fermix.config import Config, RealtimeConfig
from fermix.errors import AccessDeniedError, InvalidInputError, NotFoundError
from fermix.home import Home
from fermix.model import JobCaller
from fermix.runtime.prompt_files import disk
from fermix.server.http.app import create_app

pytestmark = pytest.mark.keep_actors


@dataclass
class Site:
    """The app over one Memory, its seeded ids and the tokens of each kind."""

    home: Path
    memory: Memory
    http: TestClient
    ids: dict[str, int]
    host: dict[str, str]
    operator: dict[str, str]
    stranger: dict[str, str]
    revoked: dict[str, str]


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _archive(home: Path, memory_id: int) -> None:
    with other_process(home) as writer:
        writer.write_rows(
            lambda w: [w.archive_row(memory_id, by="operator", reason="outdated")],
            label="archive",
        )


def seed_agent(home: Path, agent: str) -> dict[str, int]:
    """Agent ``agent``: alice's tea then coffee (USER.md revisions 1, 2...) and two archived
    rows; agent ``other``: a row of its own, archived, and its USER.md. Written as another
    process writes (a running server reads them from its next request)."""
    ids = {}
    for name, owner, category, key, value in [
        ("tea", agent, "preference", "drink", "Drinks green tea"),
        ("coffee", agent, "preference", "drink", "Drinks black coffee"),
        ("nurse", agent, "identity", "job", "Works as a nurse"),
        ("porto", agent, "identity", "city", "Lives in Porto"),
        ("secret", "other", "identity", "job", "Other agent's secret job"),
    ]:
        agent_of = owner
        with other_process(home) as writer:
            unit = fact(category, key, value, agent_id=agent_of, owner_id="alice")
            written = writer.write_rows(unit, label="seed", also=[(agent_of, "alice")])
            assert written.error is None
            ids[name] = written.rows[0].id
    for name in ("nurse", "porto", "secret"):
        _archive(home, ids[name])
    return ids


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    home = tmp_path_factory.mktemp("admin") / "home"
    home.mkdir(mode=0o700)
    ids = seed_agent(home, "bot")
    config = Config(realtime=RealtimeConfig(persist_transcripts=True))
    with Memory(Home(home), config=config) as memory:
        tokens = memory.tokens
        _, host = tokens.create(["bot"], name="host")
        _, operator = tokens.create(["bot"], operator=True, name="operator")
        _, stranger = tokens.create(["other"], name="other")
        gone, revoked = tokens.create(["bot"], name="gone")
        tokens.revoke(gone.id)
        other_job = memory.create_job("other", "nightly", schedule="daily", prompt="sum up")
        ids["other_job"] = other_job.id
        ids["other_run"] = memory.start_run(other_job.id).id
        with TestClient(create_app(memory)) as http:
            yield Site(
                home,
                memory,
                http,
                ids,
                _bearer(host),
                _bearer(operator),
                _bearer(stranger),
                _bearer(revoked),
            )


def error(response: Any, status: int, field: str | None = None) -> dict[str, Any]:
    """The error of ``response``, checked to be ``status`` naming ``field``."""
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert "Traceback" not in body["message"]
    if field is not None:
        assert body.get("field") == field, body
    return dict(body)


def ids_of(response: Any, key: str = "memories") -> list[int]:
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()[key]]


# -- memory rows -------------------------------------------------------------------------


def test_n1_list_rows_of_the_agent_live_archived_or_both(site: Site) -> None:
    get, ids = site.http.get, site.ids
    url = "/v1/agents/bot/memories"
    live = ids_of(get(url, headers=site.host))
    assert ids["coffee"] in live and ids["nurse"] not in live
    assert ids["tea"] == ids["coffee"]  # one key, upserted: the same row
    archived = ids_of(get(url, params={"archived_only": "true"}, headers=site.host))
    assert ids["nurse"] in archived and ids["coffee"] not in archived
    both = ids_of(get(url, params={"include_archived": "true"}, headers=site.host))
    assert {ids["coffee"], ids["nurse"]} <= set(both)
    assert ids["secret"] not in both  # another agent's row is never listed (N2)


def test_n1_list_rows_filters_by_owner_scope_category_and_limit(site: Site) -> None:
    get, ids = site.http.get, site.ids
    url = "/v1/agents/bot/memories"
    params = {"include_archived": "true", "owner_id": "alice", "scope": "owner:alice"}
    assert len(ids_of(get(url, params=params, headers=site.host))) >= 2
    identity = ids_of(get(url, params={**params, "category": "identity"}, headers=site.host))
    assert ids["coffee"] not in identity and ids["nurse"] in identity
    assert ids_of(get(url, params={"owner_id": "bob"}, headers=site.host)) == []
    assert len(ids_of(get(url, params={**params, "limit": 1}, headers=site.host))) == 1


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": 0}, "query.limit"),
        ({"limit": "many"}, "query.limit"),
        ({"scope": "planet"}, "query.scope"),
        ({"scope": "owner:" + "a" * 300}, "query.scope"),
        ({"category": "gossip"}, "query.category"),
        ({"include_archived": "perhaps"}, "query.include_archived"),
    ],
)
def test_n2_list_rows_refuses_bad_filters_naming_them(
    site: Site, params: dict[str, Any], field: str
) -> None:
    response = site.http.get("/v1/agents/bot/memories", params=params, headers=site.host)
    error(response, 422, field)


def test_n2_every_agent_route_needs_a_live_token_for_that_agent(site: Site) -> None:
    get = site.http.get
    error(get("/v1/agents/bot/memories"), 401, "header.authorization")
    error(get("/v1/agents/bot/memories", headers={"Authorization": "Basic x"}), 401)
    error(get("/v1/agents/bot/memories", headers=_bearer("fmx_nope")), 401)
    error(get("/v1/agents/bot/memories", headers=site.revoked), 401, "header.authorization")
    for path in (
        "/v1/agents/other/memories",
        "/v1/agents/other/memories/search?q=job",
        "/v1/agents/other/resources",
        "/v1/agents/other/resources/user_md?owner_id=alice",
        "/v1/agents/other/resources/user_md/history",
        "/v1/agents/other/jobs",
    ):
        error(get(path, headers=site.host), 403, "path.agent_id")


def test_n1_search_finds_words_in_keys_and_values(site: Site) -> None:
    get, ids = site.http.get, site.ids
    url = "/v1/agents/bot/memories/search"
    assert ids_of(get(url, params={"q": "coffee"}, headers=site.host)) == [ids["coffee"]]
    # FTS syntax is plain words, never an error
    assert ids_of(get(url, params={"q": 'coffee AND "('}, headers=site.host)) == [ids["coffee"]]
    assert ids_of(get(url, params={"q": "nurse"}, headers=site.host)) == []
    found = ids_of(get(url, params={"q": "nurse", "archived_only": "true"}, headers=site.host))
    assert found == [ids["nurse"]]
    # the other agent's matching row stays out of bot's search (N2)
    assert (
        ids_of(get(url, params={"q": "secret", "include_archived": "true"}, headers=site.host))
        == []
    )
    error(get(url, headers=site.host), 422, "query.q")


def test_n1_show_row_and_another_agents_row_is_a_404_like_a_missing_one(site: Site) -> None:
    get, ids = site.http.get, site.ids
    shown = get(f"/v1/memories/{ids['nurse']}", headers=site.host)
    assert shown.status_code == 200
    assert shown.json()["value"] == "Works as a nurse" and shown.json()["archived_at"] is not None
    theirs = error(get(f"/v1/memories/{ids['secret']}", headers=site.host), 404, "path.memory_id")
    missing = error(get("/v1/memories/999999", headers=site.host), 404, "path.memory_id")
    assert theirs["type"] == missing["type"] == "not_found"
    assert "secret" not in theirs["message"] and "other" not in theirs["message"]
    error(get("/v1/memories/0", headers=site.host), 422, "path.memory_id")
    error(get("/v1/memories/abc", headers=site.host), 422, "path.memory_id")


def test_n2_restore_needs_an_operator_token_and_a_host_token_changes_nothing(
    site: Site,
) -> None:
    post, ids = site.http.post, site.ids
    porto = ids["porto"]
    error(post(f"/v1/memories/{porto}/restore", headers=site.host), 403)
    error(post(f"/v1/memories/{porto}/restore"), 401)
    with reading(site.home) as reads:
        row = reads.row(porto)
        assert row is not None and row.archived  # untouched
    # the operator token of bot cannot restore the other agent's row, nor learn it exists
    error(post(f"/v1/memories/{ids['secret']}/restore", headers=site.operator), 404)
    with reading(site.home) as reads:
        secret = reads.row(ids["secret"])
        assert secret is not None and secret.archived
    error(post("/v1/memories/999999/restore", headers=site.operator), 404, "path.memory_id")

    restored = post(f"/v1/memories/{porto}/restore", headers=site.operator)
    assert restored.status_code == 200, restored.text
    assert restored.json()["archived_at"] is None and restored.json()["id"] == porto
    with reading(site.home) as reads:
        row = reads.row(porto)
        assert row is not None and not row.archived
    # the row shows again in alice's USER.md, rebuilt by the restore (S7)
    current = site.http.get(
        "/v1/agents/bot/resources/user_md", params={"owner_id": "alice"}, headers=site.host
    )
    assert "Lives in Porto" in current.json()["content"]


# -- prompt-file resources ---------------------------------------------------------------


def test_n1_resources_list_and_show_the_current_and_an_old_revision(site: Site) -> None:
    get = site.http.get
    listed = get("/v1/agents/bot/resources", headers=site.host)
    assert listed.status_code == 200
    names = {(r["owner_id"], r["name"]) for r in listed.json()["resources"]}
    assert ("alice", "user_md") in names
    assert all(r["agent_id"] == "bot" for r in listed.json()["resources"])
    assert get("/v1/agents/bot/resources?owner_id=bob", headers=site.host).json() == {
        "resources": []
    }
    url = "/v1/agents/bot/resources/user_md"
    first = get(url, params={"owner_id": "alice", "revision": 1}, headers=site.host)
    assert first.status_code == 200 and "green tea" in first.json()["content"]
    current = get(url, params={"owner_id": "alice"}, headers=site.host).json()
    assert current["revision"] > 1 and "green tea" not in current["content"]
    error(get(url, params={"owner_id": "alice", "revision": 999}, headers=site.host), 404)
    error(get(url, params={"owner_id": "nobody"}, headers=site.host), 404)
    error(get(url, params={"revision": 0}, headers=site.host), 422, "query.revision")
    error(get("/v1/agents/bot/resources/notes_md", headers=site.host), 422, "path.name")


def test_n1_history_lists_revisions_newest_first(site: Site) -> None:
    url = "/v1/agents/bot/resources/user_md/history"
    history = site.http.get(url, params={"owner_id": "alice"}, headers=site.host)
    numbers = [r["revision"] for r in history.json()["revisions"]]
    assert numbers == sorted(numbers, reverse=True) and numbers[-1] == 1
    one = site.http.get(url, params={"owner_id": "alice", "limit": 1}, headers=site.host)
    assert [r["revision"] for r in one.json()["revisions"]] == numbers[:1]
    error(site.http.get(url, params={"limit": -1}, headers=site.host), 422, "query.limit")


def test_n2_rollback_needs_an_operator_token_and_a_host_token_changes_nothing(
    site: Site,
) -> None:
    post, get = site.http.post, site.http.get
    url = "/v1/agents/bot/resources/user_md"
    before = get(url, params={"owner_id": "alice"}, headers=site.host).json()
    body = {"revision": 1, "owner_id": "alice"}
    error(post(f"{url}/rollback", json=body, headers=site.host), 403)
    error(
        post("/v1/agents/other/resources/user_md/rollback", json=body, headers=site.operator),
        403,
        "path.agent_id",
    )
    assert get(url, params={"owner_id": "alice"}, headers=site.host).json() == before

    error(
        post(f"{url}/rollback", json={"owner_id": "alice"}, headers=site.operator),
        422,
        "body.revision",
    )
    error(
        post(f"{url}/rollback", json={**body, "force": True}, headers=site.operator),
        422,
        "body.force",
    )
    error(post(f"{url}/rollback", json={**body, "revision": 999}, headers=site.operator), 404)

    rolled = post(f"{url}/rollback", json=body, headers=site.operator)
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["reason"] == "rollback:1" and "green tea" in rolled.json()["content"]
    assert rolled.json()["revision"] == before["revision"] + 1
    user_md, _ = disk.paths(Home(site.home), "bot", "alice")
    assert "green tea" in user_md.read_text(encoding="utf-8")


# -- scheduled jobs and runs -------------------------------------------------------------


def test_n1_jobs_create_get_and_list_only_the_tokens_agents(site: Site) -> None:
    post, get = site.http.post, site.http.get
    body = {"name": "digest", "schedule": "0 8 * * *", "prompt": "summarise the day"}
    created = post("/v1/agents/bot/jobs", json=body, headers=site.host)
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["agent_id"] == "bot" and job["schedule"] == "0 8 * * *"
    error(post("/v1/agents/bot/jobs", json=body, headers=site.host), 422)  # same name
    error(
        post("/v1/agents/bot/jobs", json={"name": "x", "schedule": "s"}, headers=site.host),
        422,
        "body.prompt",
    )
    error(post("/v1/agents/other/jobs", json=body, headers=site.host), 403, "path.agent_id")
    assert get(f"/v1/jobs/{job['id']}", headers=site.host).json() == job
    assert job["id"] in ids_of(get("/v1/agents/bot/jobs", headers=site.host), "jobs")
    mine = ids_of(get("/v1/jobs", headers=site.host), "jobs")
    assert job["id"] in mine and site.ids["other_job"] not in mine
    error(get(f"/v1/jobs/{site.ids['other_job']}", headers=site.host), 404, "path.job_id")
    error(get("/v1/jobs/999999", headers=site.host), 404, "path.job_id")


def test_n1_a_runs_life_start_tools_finish_and_its_tools_refused_after(site: Site) -> None:
    post, get = site.http.post, site.http.get
    body = {"name": "weekly", "schedule": "weekly", "prompt": "p", "owner_id": "alice"}
    job = post("/v1/agents/bot/jobs", json=body, headers=site.host).json()
    run = post(f"/v1/jobs/{job['id']}/runs", headers=site.host)
    assert run.status_code == 201 and run.json()["status"] == "running"
    run_id = run.json()["id"]
    caller = get(f"/v1/runs/{run_id}/caller", headers=site.host).json()
    assert caller == {
        "agent_id": "bot",
        "memory_source_id": job["memory_source_id"],
        "owner_id": "alice",
        "run_id": run_id,
    }

    def tool(name: str, **arguments: Any) -> dict[str, Any]:
        call = {"function": {"name": name, "arguments": json.dumps(arguments)}}
        answer = post(f"/v1/runs/{run_id}/tools/run", json={"tool_call": call}, headers=site.host)
        assert answer.status_code == 200, answer.text
        return dict(json.loads(answer.json()["content"]))

    assert "error" not in tool("memory_store", key="last", value="read 3 papers")
    recalled = tool("memory_recall", query="papers")
    assert "read 3 papers" in json.dumps(recalled)
    assert "error" in tool("no_such_tool")
    error(post(f"/v1/runs/{run_id}/tools/run", json={}, headers=site.host), 422, "body.tool_call")

    bad = {"status": "done"}
    error(post(f"/v1/runs/{run_id}/finish", json=bad, headers=site.host), 422, "body.status")
    done = post(
        f"/v1/runs/{run_id}/finish", json={"status": "succeeded", "output": "ok"}, headers=site.host
    )
    assert done.status_code == 200 and done.json()["finished_at"] is not None
    error(post(f"/v1/runs/{run_id}/finish", json={"status": "failed"}, headers=site.host), 422)
    assert "error" in tool("memory_recall", query="papers")  # refused once finished (T2)
    error(get(f"/v1/runs/{run_id}/caller", headers=site.host), 422, "path.run_id")
    second = post(f"/v1/jobs/{job['id']}/runs", headers=site.host).json()
    runs = get(f"/v1/jobs/{job['id']}/runs", headers=site.host).json()["runs"]
    assert [r["id"] for r in runs] == [second["id"], run_id]
    limited = get(f"/v1/jobs/{job['id']}/runs", params={"limit": 1}, headers=site.host)
    assert ids_of(limited, "runs") == [second["id"]]
    too_many = get(f"/v1/jobs/{job['id']}/runs", params={"limit": 10_001}, headers=site.host)
    error(too_many, 422, "query.limit")
    assert get(f"/v1/runs/{run_id}", headers=site.host).json()["output"] == "ok"


def test_n2_another_agents_job_and_run_are_404_and_stay_untouched(site: Site) -> None:
    post, get = site.http.post, site.http.get
    job, run = site.ids["other_job"], site.ids["other_run"]
    error(post(f"/v1/jobs/{job}/runs", headers=site.host), 404, "path.job_id")
    error(get(f"/v1/jobs/{job}/runs", headers=site.host), 404, "path.job_id")
    for path in (f"/v1/runs/{run}", f"/v1/runs/{run}/caller"):
        error(get(path, headers=site.host), 404, "path.run_id")
    call = {"tool_call": {"function": {"name": "memory_recall", "arguments": "{}"}}}
    error(post(f"/v1/runs/{run}/tools/run", json=call, headers=site.host), 404, "path.run_id")
    finish = {"status": "failed", "error": "hijacked"}
    error(post(f"/v1/runs/{run}/finish", json=finish, headers=site.host), 404, "path.run_id")
    stored = site.memory.get_run(run)
    assert stored is not None and stored.status == "running"
    assert len(site.memory.list_runs(job)) == 1
    error(get("/v1/runs/0", headers=site.host), 422, "path.run_id")


# -- voice and status --------------------------------------------------------------------


def test_n1_voice_transcript_is_stored_and_a_host_token_speaks_as_a_guest(site: Site) -> None:
    post = site.http.post
    body = {"device_id": "kitchen", "role": "user", "text": "remind me of tea", "owner_id": "alice"}
    stored = post("/v1/agents/bot/voice", json=body, headers=site.host)
    assert stored.status_code == 200, stored.text
    message = stored.json()["message"]
    assert message["kind"] == "voice_turn" and message["channel"] == "realtime"
    assert message["chat_id"] == "kitchen" and message["trust"] == "guest"
    assert message["metadata"] == {"source_type": "realtime", "device_id": "kitchen"}
    error(
        post("/v1/agents/bot/voice", json={**body, "trust": "operator"}, headers=site.host),
        403,
        "body.trust",
    )
    as_operator = post(
        "/v1/agents/bot/voice", json={**body, "trust": "operator"}, headers=site.operator
    )
    assert as_operator.json()["message"]["trust"] == "operator"
    error(
        post("/v1/agents/bot/voice", json={**body, "role": "system"}, headers=site.host),
        422,
        "body.role",
    )
    error(
        post("/v1/agents/bot/voice", json={**body, "text": 5}, headers=site.host), 422, "body.text"
    )
    error(post("/v1/agents/other/voice", json=body, headers=site.host), 403, "path.agent_id")


def test_n2_status_is_for_operator_tokens_only(site: Site) -> None:
    error(site.http.get("/v1/status", headers=site.host), 403)
    error(site.http.get("/v1/status"), 401)
    status = site.http.get("/v1/status", headers=site.operator)
    assert status.status_code == 200
    assert "live_conversations" in status.json()["memory"]
    with TestClient(create_app(site.memory, status=lambda: {"server": {"pid": 7}})) as other:
        assert other.get("/v1/status", headers=site.operator).json() == {"server": {"pid": 7}}


# -- the OpenAPI document ----------------------------------------------------------------

ADMIN_ROUTES = {
    ("get", "/v1/agents/{agent_id}/memories"): "MemoryRows",
    ("get", "/v1/agents/{agent_id}/memories/search"): "MemoryRows",
    ("get", "/v1/memories/{memory_id}"): "MemoryRowOut",
    ("post", "/v1/memories/{memory_id}/restore"): "MemoryRowOut",
    ("get", "/v1/agents/{agent_id}/resources"): "Resources",
    ("get", "/v1/agents/{agent_id}/resources/{name}"): "RevisionOut",
    ("get", "/v1/agents/{agent_id}/resources/{name}/history"): "Revisions",
    ("post", "/v1/agents/{agent_id}/resources/{name}/rollback"): "RevisionOut",
    ("post", "/v1/agents/{agent_id}/jobs"): "JobOut",
    ("get", "/v1/agents/{agent_id}/jobs"): "Jobs",
    ("get", "/v1/jobs"): "Jobs",
    ("get", "/v1/jobs/{job_id}"): "JobOut",
    ("post", "/v1/jobs/{job_id}/runs"): "RunOut",
    ("get", "/v1/jobs/{job_id}/runs"): "Runs",
    ("get", "/v1/runs/{run_id}"): "RunOut",
    ("post", "/v1/runs/{run_id}/finish"): "RunOut",
    ("get", "/v1/runs/{run_id}/caller"): "JobCallerOut",
    ("post", "/v1/runs/{run_id}/tools/run"): "ToolResult",
    ("post", "/v1/agents/{agent_id}/voice"): "VoiceOut",
    ("get", "/v1/status"): "Status",
}
REQUEST_MODELS = {
    ("post", "/v1/agents/{agent_id}/resources/{name}/rollback"): "RollbackIn",
    ("post", "/v1/agents/{agent_id}/jobs"): "JobIn",
    ("post", "/v1/runs/{run_id}/finish"): "FinishIn",
    ("post", "/v1/runs/{run_id}/tools/run"): "ToolRunIn",
    ("post", "/v1/agents/{agent_id}/voice"): "VoiceIn",
}


def test_n1_the_openapi_document_lists_every_admin_route_with_its_models(site: Site) -> None:
    document = site.http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    for (method, path), model in ADMIN_ROUTES.items():
        operation = document["paths"][path][method]
        assert operation["description"] or operation["summary"], path
        codes = [c for c in operation["responses"] if c.startswith("2")]
        content = operation["responses"][codes[0]]["content"]["application/json"]
        assert content["schema"]["$ref"].endswith(f"/{model}"), (path, content)
        assert schemas[model]["description"], model
    for (method, path), model in REQUEST_MODELS.items():
        body = document["paths"][path][method]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"].endswith(f"/{model}"), path
        fields = schemas[model]["properties"]
        assert all(f.get("description") for f in fields.values()), model
    row_fields = schemas["MemoryRowOut"]["properties"]
    assert {"archived_at", "source_type", "promote_target"} <= set(row_fields)
    assert all(f.get("description") for f in row_fields.values())


# -- fermix.Client against a real server process (N4) ------------------------------------

# That the client's methods have the embedded signatures is fermix.surface's, checked by
# mypy --strict and tests/server/test_surface.py.


def test_n4_client_inspects_rows_and_revisions_as_the_embedded_memory(
    module_server: ServerProcess,
) -> None:
    """Through a real server process: every row and revision call answers what the
    home's database holds; restore and rollback need the operator token (N2, N4)."""
    server = module_server
    ids = seed_agent(server.home, "assistant")
    host, operator = server.client(), server.client(server.operator_token)

    with reading(server.home) as reads:
        assert host.list_rows(agent_id="assistant") == reads.rows(agent_id="assistant")
        both = reads.rows(agent_id="assistant", archived=None)
        assert host.list_rows(agent_id="assistant", archived=None) == both
        assert host.get_row(ids["nurse"]) == reads.row(ids["nurse"])
        history = reads.revisions("assistant", "user_md", owner_id="alice", limit=20)
        assert host.resources("assistant") == reads.resources("assistant")
    assert host.revisions("assistant", "user_md", owner_id="alice") == history
    assert host.get_row(ids["secret"]) is None  # another agent's: as if missing (N2)
    assert host.list_rows(agent_id="assistant", scopes=[]) == []
    assert [r.id for r in host.search_rows("coffee", agent_id="assistant")] == [ids["coffee"]]
    with pytest.raises(InvalidInputError, match="agent_id"):
        host.list_rows()
    with pytest.raises(AccessDeniedError):
        host.list_rows(agent_id="other")

    with pytest.raises(AccessDeniedError):
        host.restore_row(ids["nurse"])
    nurse = host.get_row(ids["nurse"])
    assert nurse is not None and nurse.archived  # the refused restore changed nothing
    restored = operator.restore_row(ids["nurse"])
    assert not restored.archived and restored == host.get_row(ids["nurse"])
    with pytest.raises(NotFoundError):
        operator.restore_row(ids["secret"])

    first = host.revision("assistant", "user_md", 1, owner_id="alice")
    assert "green tea" in first.content
    with pytest.raises(AccessDeniedError):
        host.rollback("assistant", "user_md", 1, owner_id="alice")
    rolled = operator.rollback("assistant", "user_md", 1, owner_id="alice")
    assert rolled.reason == "rollback:1" and rolled.content == first.content
    assert host.revision("assistant", "user_md", owner_id="alice") == rolled
    with pytest.raises(NotFoundError):
        host.revision("assistant", "user_md", 999, owner_id="alice")
    with pytest.raises(InvalidInputError):
        host.revisions("assistant", "notes_md")


def test_n4_client_runs_a_job_and_its_tools_and_voice_through_a_real_server(
    module_server: ServerProcess,
) -> None:
    """A job's whole life, its tools as the job's caller, and voice transcripts (off in
    this server's config: None, as the embedded memory answers) (N4, T2, V1)."""
    host = module_server.client()
    job = host.create_job("assistant", "digest", schedule="daily", prompt="sum up")
    assert host.get_job(job.id) == job and host.list_jobs() == [job]
    assert host.list_jobs(agent_id="assistant") == [job]
    run = host.start_run(job.id)
    caller = host.job_caller(run.id)
    assert caller == JobCaller("assistant", job.memory_source_id, "", run_id=run.id)
    store = {"function": {"name": "memory_store", "arguments": '{"key": "k", "value": "kept"}'}}
    assert "error" not in json.loads(host.tools.run(store, caller))
    done = host.finish_run(run.id, status="succeeded", output="done")
    assert done.status == "succeeded" and host.get_run(run.id) == done
    assert host.list_runs(job.id) == [done]
    assert "error" in json.loads(host.tools.run(store, caller))  # finished: refused (T2)
    with pytest.raises(InvalidInputError):
        host.job_caller(run.id)
    with pytest.raises(InvalidInputError):
        host.finish_run(run.id, status="failed")
    with pytest.raises(InvalidInputError):
        host.create_job("assistant", "digest", schedule="daily", prompt="again")
    assert host.get_job(999_999) is None and host.get_run(999_999) is None

    assert host.voice_transcript("assistant", "car", "user", "call mum") is None
    with pytest.raises(AccessDeniedError):
        host.voice_transcript("assistant", "car", "user", "x", trust="operator")
    with pytest.raises(InvalidInputError):
        host.voice_transcript("assistant", "car", "system", "x")
