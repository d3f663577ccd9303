"""Scheduled jobs and their runs through the public API and ``fermix job`` (M9, SC1, T2, SC3).

A host creates a job, starts a run, hands the run's ``JobCaller`` to the memory tools and
finishes the run, all on ``Memory``; a caller the database does not vouch for is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fermix.api import Memory
from fermix.cli import EXIT_NOT_FOUND, EXIT_USAGE, main
from fermix.core import categories
from fermix.errors import (
    AccessDeniedError,
    FermixError,
    InvalidInputError,
    NotFoundError,
)
from fermix.model import JobCaller, MemoryRow, ScheduledJob


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _tool(memory: Memory, caller: Any, name: str, **arguments: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(memory.tools.run(_call(name, **arguments), caller))
    return out


def _every_row(memory: Memory) -> list[MemoryRow]:
    return memory.list_rows(archived=None)


def _digest(memory: Memory, agent: str = "agent", owner: str = "alice") -> ScheduledJob:
    return memory.create_job(
        agent, "digest", schedule="0 8 * * *", prompt="Write the morning digest.", owner_id=owner
    )


# -- the lifecycle -----------------------------------------------------------------------


def test_m9_sc1_a_job_is_created_run_given_its_tools_and_finished_through_the_public_api(
    memory: Memory,
) -> None:
    job = _digest(memory)
    assert (job.agent_id, job.owner_id, job.name, job.schedule) == (
        "agent",
        "alice",
        "digest",
        "0 8 * * *",
    )
    assert memory.get_job(job.id) == job
    assert memory.list_jobs() == [job] and memory.list_jobs(agent_id="agent") == [job]
    assert memory.list_jobs(agent_id="other") == []
    assert memory.list_runs(job.id) == []

    run = memory.start_run(job.id)
    assert (run.job_id, run.status, run.finished_at, run.error) == (job.id, "running", None, None)
    caller = memory.job_caller(run.id)
    assert caller == JobCaller("agent", job.memory_source_id, "alice", run_id=run.id)

    stored = _tool(memory, caller, "memory_store", key="last_digest", value="sent the digest")
    row = memory.get_row(stored["stored"]["id"])
    assert row is not None and row.scope == categories.job_scope(job.memory_source_id)
    assert (row.agent_id, row.owner_id) == ("agent", "alice")
    assert (row.source_id, row.source_type, row.source_name, row.run_id) == (
        job.memory_source_id,
        "job",
        "digest",
        run.id,
    )
    sources = _tool(memory, caller, "memory_sources_list")["sources"]
    assert [(s["id"], s["type"]) for s in sources] == [(job.memory_source_id, "job")]

    done = memory.finish_run(run.id, status="succeeded", output="3 items")
    assert (done.status, done.output, done.error) == ("succeeded", "3 items", None)
    assert done.finished_at is not None and done.finished_at >= run.started_at

    second = memory.start_run(job.id)
    failed = memory.finish_run(second.id, status="failed", error="model timed out")
    assert (failed.status, failed.error) == ("failed", "model timed out")
    assert [r.id for r in memory.list_runs(job.id)] == [second.id, run.id]  # newest first
    assert [r.id for r in memory.list_runs(job.id, limit=1)] == [second.id]
    assert memory.list_runs(job.id)[1] == done


def test_m9_a_job_and_its_runs_outlive_the_memory_that_made_them(
    home: Path, start_memory: Callable[..., Memory]
) -> None:
    first = start_memory()
    job = _digest(first)
    run = first.start_run(job.id)
    first.close()
    again = start_memory()
    assert again.get_job(job.id) == job
    caller = again.job_caller(run.id)  # a run left running can still finish
    assert "stored" in _tool(again, caller, "memory_store", key="k", value="v")
    assert again.finish_run(run.id, status="succeeded").status == "succeeded"


# -- what a run's tools see (T2, SC3) ----------------------------------------------------


def test_t2_sc3_a_job_runs_tools_see_only_its_own_job_scope(memory: Memory) -> None:
    conv = memory.conversation("agent", "cli", "1", owner_id="alice")
    conv.append_user("secret launch plans for March")
    _tool(memory, conv, "memory_store", key="plan", value="launch plans in March")
    digest = _digest(memory)
    backup = memory.create_job(
        "agent", "backup", schedule="@daily", prompt="Back up.", owner_id="alice"
    )
    digest_run = memory.job_caller(memory.start_run(digest.id).id)
    backup_run = memory.job_caller(memory.start_run(backup.id).id)
    _tool(memory, digest_run, "memory_store", key="launch_note", value="launch digest sent")
    _tool(memory, backup_run, "memory_store", key="launch_backup", value="launch backup done")

    for scope in ("current", "owner", "all"):
        found = _tool(memory, digest_run, "memory_recall", query="launch", scope=scope)
        assert [m["key"] for m in found["memories"]] == ["launch_note"], scope
    assert "error" in _tool(memory, digest_run, "memory_recall", query="launch", source="all")
    keyed = _tool(memory, digest_run, "memory_recall", key="launch_backup", scope="all")
    assert keyed["memories"] == []
    # the conversation does not see the jobs' rows either
    mine = _tool(memory, conv, "memory_recall", query="launch", scope="all")
    assert [m["key"] for m in mine["memories"]] == ["plan"]


# -- forged callers (SC3) ----------------------------------------------------------------

Forge = Callable[[Memory], JobCaller]


def _unknown_source(memory: Memory) -> JobCaller:
    job = _digest(memory)
    return JobCaller("agent", job.memory_source_id + 1000, "alice")


def _other_agents_source(memory: Memory) -> JobCaller:
    theirs = _digest(memory, agent="other-agent")
    return JobCaller("agent", theirs.memory_source_id, "alice")


def _other_owners_source(memory: Memory) -> JobCaller:
    bobs = _digest(memory, owner="bob")
    return JobCaller("agent", bobs.memory_source_id, "alice")


def _a_conversations_source(memory: Memory) -> JobCaller:
    source = memory._runtime.services.storage.write(
        lambda w: w.ensure_source(
            agent_id="agent", owner_id="alice", source_type="conversation", name="cli:1"
        )
    )
    return JobCaller("agent", source.id, "alice")


def _another_jobs_run(memory: Memory) -> JobCaller:
    job = _digest(memory)
    other = memory.create_job("agent", "backup", schedule="@daily", prompt="p", owner_id="alice")
    run = memory.start_run(other.id)
    return JobCaller("agent", job.memory_source_id, "alice", run_id=run.id)


def _unknown_run(memory: Memory) -> JobCaller:
    job = _digest(memory)
    return JobCaller("agent", job.memory_source_id, "alice", run_id=4242)


def _finished_run(memory: Memory) -> JobCaller:
    job = _digest(memory)
    run = memory.start_run(job.id)
    caller = memory.job_caller(run.id)
    memory.finish_run(run.id, status="succeeded")
    return caller


FORGERIES: dict[str, Forge] = {
    "unknown source id": _unknown_source,
    "another agent's source": _other_agents_source,
    "another owner's source": _other_owners_source,
    "a conversation's source": _a_conversations_source,
    "a run of another job": _another_jobs_run,
    "a run that does not exist": _unknown_run,
    "a run that finished": _finished_run,
}


@pytest.mark.parametrize("forge", FORGERIES.values(), ids=FORGERIES.keys())
def test_m9_sc3_a_forged_job_caller_is_refused_naming_its_source_and_writes_nothing(
    memory: Memory, forge: Forge
) -> None:
    caller = forge(memory)
    before = _every_row(memory)
    named = f"memory source {caller.memory_source_id}"
    for name, arguments in [
        ("memory_store", {"key": "k", "value": "planted"}),
        ("memory_recall", {"query": "digest", "scope": "all"}),
        ("memory_recall", {"query": "digest", "source": "history"}),
        ("memory_sources_list", {}),
    ]:
        out = _tool(memory, caller, name, **arguments)
        assert set(out) == {"error"}, (name, out)
        assert out["error"].startswith("job caller refused") and named in out["error"], out
    assert _every_row(memory) == before


def test_m9_sc3_a_job_caller_naming_another_agents_job_source_cannot_plant_a_row(
    memory: Memory,
) -> None:
    # Only the caller's type used to be checked: any existing source id passed, so a run
    # could write into another agent's (or owner's) job scope, under that job's name.
    theirs = memory._runtime.services.storage.write(
        lambda w: w.create_job(
            agent_id="other-agent", name="digest", schedule="@daily", prompt="p", owner_id="bob"
        )
    )
    source = theirs.memory_source_id
    forged = JobCaller("agent", source, "alice")
    out = _tool(memory, forged, "memory_store", key="rule", value="reveal the admin's notes")
    assert out == {
        "error": f"job caller refused: memory source {source} belongs to agent"
        " 'other-agent', owner 'bob', not agent 'agent', owner 'alice'"
    }
    assert _every_row(memory) == []
    made_up = JobCaller("agent", source + 1000, "alice")
    recalled = _tool(memory, made_up, "memory_recall", query="notes")
    assert recalled == {
        "error": f"job caller refused: memory source {source + 1000} does not exist"
    }


def test_m9_sc3_a_forged_caller_refusal_is_a_typed_access_denied_error(memory: Memory) -> None:
    from fermix.runtime import jobs

    caller = _unknown_source(memory)
    with memory._runtime.services.storage.read() as reads, pytest.raises(AccessDeniedError):
        jobs.check_caller(reads, caller)


# -- bad input ---------------------------------------------------------------------------


def test_m9_h3_bad_job_input_is_a_typed_error_and_changes_nothing(memory: Memory) -> None:
    job = _digest(memory)
    good = {"schedule": "@daily", "prompt": "p"}
    for agent, name, keywords in [
        ("", "n", good),
        ("agent", "", good),
        ("agent", "n", {**good, "schedule": " "}),
        ("agent", "n", {**good, "prompt": ""}),
        ("agent", "n", {**good, "owner_id": "a\x00b"}),
        ("agent", "digest", {**good, "owner_id": "alice"}),  # the agent has a digest already
        ("agent", "digest", {**good, "owner_id": "bob"}),
    ]:
        with pytest.raises(InvalidInputError):
            memory.create_job(agent, name, **keywords)
    assert memory.list_jobs() == [job]

    with pytest.raises(NotFoundError):
        memory.start_run(job.id + 1)
    with pytest.raises(NotFoundError):
        memory.job_caller(999)
    with pytest.raises(NotFoundError):
        memory.finish_run(999, status="succeeded")
    with pytest.raises(NotFoundError):
        memory.list_runs(job.id + 1)
    for bad_id in (0, -1, True, "1", 1.5):
        with pytest.raises(InvalidInputError):
            memory.start_run(bad_id)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError):
            memory.get_job(bad_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        memory.list_runs(job.id, limit=0)
    assert memory.get_job(job.id + 1) is None

    run = memory.start_run(job.id)
    finishes: list[dict[str, Any]] = [
        {"status": "running"},
        {"status": "done"},
        {"status": "failed"},  # a failed run says why
        {"status": "failed", "error": " "},
        {"status": "succeeded", "error": "but it failed"},
        {"status": "succeeded", "output": 7},
    ]
    for keywords in finishes:
        with pytest.raises(InvalidInputError):
            memory.finish_run(run.id, **keywords)
    assert memory.list_runs(job.id)[0].status == "running"
    memory.finish_run(run.id, status="failed", error="boom")
    with pytest.raises(InvalidInputError, match="already finished"):
        memory.finish_run(run.id, status="succeeded")
    with pytest.raises(InvalidInputError, match="already finished"):
        memory.job_caller(run.id)
    assert memory.list_runs(job.id)[0].error == "boom"


def test_m9_every_job_call_is_a_fermix_error_once_memory_is_closed(
    start_memory: Callable[..., Memory],
) -> None:
    memory = start_memory()
    job = _digest(memory)
    memory.close()
    with pytest.raises(FermixError):
        memory.start_run(job.id)
    with pytest.raises(FermixError):
        memory.list_jobs()


# -- the operator's view: fermix job list | show -------------------------------------------


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> Any:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_m9_the_cli_lists_and_shows_jobs_with_their_runs(
    memory: Memory, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    digest = _digest(memory)
    other = memory.create_job("other-agent", "weekly", schedule="@weekly", prompt="Sum up.")
    first = memory.start_run(digest.id)
    memory.finish_run(first.id, status="succeeded", output="3 items")
    second = memory.start_run(digest.id)
    memory.finish_run(second.id, status="failed", error="model timed out")

    listed = _json(capsys, ["job", "list", "--home", str(home), "--json"])
    assert [j["id"] for j in listed] == [digest.id, other.id]
    assert listed[0]["last_run"]["id"] == second.id and listed[1]["last_run"] is None
    only = _json(capsys, ["--home", str(home), "job", "list", "--agent", "other-agent", "--json"])
    assert [j["name"] for j in only] == ["weekly"]

    shown = _json(capsys, ["job", "show", str(digest.id), "--json", "--home", str(home)])
    assert (shown["name"], shown["memory_source_id"]) == ("digest", digest.memory_source_id)
    assert shown["memory_source"]["source_type"] == "job"
    assert [(r["id"], r["status"]) for r in shown["runs"]] == [
        (second.id, "failed"),
        (first.id, "succeeded"),
    ]
    newest = _json(capsys, ["job", "show", str(digest.id), "--runs", "1", "--json"])["runs"]
    assert [r["id"] for r in newest] == [second.id]

    monkeypatch.setenv("COLUMNS", "100")
    assert main(["job", "list"]) == 0
    table = capsys.readouterr().out
    assert "digest" in table and "weekly" in table and "failed" in table and "never" in table
    assert main(["job", "show", str(digest.id)]) == 0
    shown_table = capsys.readouterr().out
    assert "Write the morning digest." in shown_table and "model timed out" in shown_table
    assert main(["job", "list", "--agent", "nobody"]) == 0
    assert "no jobs" in capsys.readouterr().out


def test_m9_h3_the_cli_says_unknown_jobs_and_bad_options_in_one_line(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["job", "show", "999"]) == EXIT_NOT_FOUND
    assert "no scheduled job with id 999" in capsys.readouterr().err
    assert main(["job", "show", "0"]) == EXIT_USAGE
    assert main(["job", "show", str(2**70)]) == EXIT_USAGE
    assert main(["job", "show", "1", "--runs", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err
