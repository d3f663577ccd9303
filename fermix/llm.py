"""Model access: every model call fermix makes goes through :func:`complete` (E4, E7, H3).

A :class:`Route` is a primary model and its fallbacks, tried in order. An error that can
pass (timeout, rate limit, 5xx, connection failure, a context window too small for the
prompt) moves on to the next model, which may be on another deployment or have a larger
window; an error that cannot (bad request, authentication, permission, not found) raises
:class:`ModelRequestError` at once, since no other model fixes a request or a configuration.
litellm's own retries (``num_retries=0``) and fallbacks are off: the chain is fermix's, so
its trace is too. Each call is tagged ``metadata={"agent": ...}`` for litellm's callbacks
and leaves one line in the ``fermix.llm`` log: agent, outcome, model, the models tried and
why they failed, tokens and latency.

Optional parameters a model refuses are dropped for that model and the call is repeated
once without them: ``reasoning_effort`` (a hint) and ``response_format`` (callers parse the
text either way, so a model without structured output still answers). A refusal is either
litellm's ``UnsupportedParamsError`` (raised before any request) or a 400 from the server
that names the parameter; :attr:`Completion.dropped` says what was dropped. This is used
instead of litellm's ``drop_params=True``, which would also drop ``tools`` silently and
hide what it dropped.

litellm is imported on the first model call, not with this module (it takes seconds, and
would fetch a price map unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set, which it is here).
A host that knows a call is coming, such as ``fermix chat`` while its user types, starts
that import in the background with :func:`preload`; the first call then waits only for
what is left of it.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

from fermix.config import ROOT_TABLE, ModelConfig, validate_key
from fermix.errors import ModelError

logger = logging.getLogger("fermix.llm")

NO_KEY = "sk-no-key"
"""The API key sent to an ``api_base`` when no key is configured (local servers want one)."""

OPTIONAL_PARAMS = ("reasoning_effort", "response_format")
"""Parameters dropped, not failed on, when a model refuses them."""

NO_MODEL_HINT = (
    "No model is configured, so fermix cannot call one. Set a litellm model name as "
    "`primary` under `[fermix_core.model]` in config.toml (for example "
    '`primary = "openai/gpt-4o-mini"`, with `api_key_env` naming the variable that holds '
    "the key), or pass --model (and --api-base for an OpenAI-compatible server such as "
    "llama.cpp, vLLM or Ollama) on the command line."
)

NO_MODEL = "no_model"
"""Why a review or a compaction was skipped when no model is configured anywhere (M8)."""

NO_MODEL_OFF = (
    "no model is configured, so fermix's reviews and compaction are off: pass one in code, "
    '`Memory(model="openai/gpt-4o-mini")` (any litellm model name), or set `primary` under '
    "`[fermix_core.model]` in config.toml"
)
"""What a host or an operator is told when no model is configured (M8)."""


class ModelRouteError(ModelError):
    """A model call failed; ``tried`` holds ``(model, error class)`` of each attempt."""

    def __init__(self, message: str, tried: tuple[tuple[str, str], ...]) -> None:
        super().__init__(message)
        self.tried = tried


class ModelRequestError(ModelRouteError):
    """A model refused the request itself (bad request, authentication, not found)."""


class ModelUnavailableError(ModelRouteError):
    """Every model on the route failed with an error that can pass (timeout, 5xx, ...)."""


@dataclass(frozen=True)
class TimeoutPolicy:
    """How long one model attempt may take; named so that every log and error cites it."""

    name: str
    timeout_s: float

    def configured(self, cfg: ModelConfig) -> TimeoutPolicy:
        """This policy with the timeout of ``[fermix_core.model] timeout_s``."""
        return replace(self, timeout_s=cfg.timeout_s)


LLM_BUFFERED = TimeoutPolicy(name="llm_buffered", timeout_s=ModelConfig().timeout_s)
"""The policy of every buffered call: reviewer, compactor and chat (E7)."""


def configure(
    cfg: ModelConfig,
    *,
    model: str | None = None,
    fallbacks: Sequence[str] | None = None,
    api_base: str | None = None,
    context_window: int | None = None,
    given_to: str | None = None,
) -> ModelConfig:
    """``[fermix_core.model]`` with the route given in code or on the command line (M8).

    Each value is checked by the rule of its config key (:func:`fermix.config.validate_key`);
    ``given_to`` (``"Memory"``) names where it was passed in the error. ``model`` replaces the
    whole chain, so the configured fallbacks are not sent to another model's server;
    ``fallbacks`` replaces the fallbacks; ``api_base`` replaces the base URL, and then the
    configured ``api_key_env`` is dropped (it belongs to the configured server);
    ``context_window`` replaces the configured window. None keeps the configured value.
    """
    given = {
        "model": model,
        "fallbacks": fallbacks,
        "api_base": api_base,
        "context_window": context_window,
    }
    checked: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        key = "primary" if name == "model" else name
        where = None if given_to is None else f"{given_to}({name}=...)"
        checked[key] = validate_key(f"{ROOT_TABLE}.model.{key}", value, source=where)
    if "primary" in checked:
        checked.setdefault("fallbacks", ())
    if checked.get("api_base", cfg.api_base) != cfg.api_base:
        checked["api_key_env"] = None
    return replace(cfg, **checked)


@dataclass(frozen=True)
class Route:
    """The models a call may use, primary first, and where and how to reach them."""

    models: tuple[str, ...]
    api_base: str | None = None
    api_key_env: str | None = None
    policy: TimeoutPolicy = LLM_BUFFERED

    @classmethod
    def from_config(
        cls,
        cfg: ModelConfig,
        *,
        model: str | None = None,
        fallbacks: Sequence[str] | None = None,
        api_base: str | None = None,
    ) -> Route:
        """The route of ``[fermix_core.model]``, with command-line overrides (``--model``,
        ``--fallback``, ``--api-base``) composed with it by :func:`configure`. The policy is
        :data:`LLM_BUFFERED` with the configured ``timeout_s``.
        """
        cfg = configure(cfg, model=model, fallbacks=fallbacks, api_base=api_base)
        return cls(
            models=(*(() if cfg.primary is None else (cfg.primary,)), *cfg.fallbacks),
            api_base=cfg.api_base,
            api_key_env=cfg.api_key_env,
            policy=LLM_BUFFERED.configured(cfg),
        )

    @property
    def primary(self) -> str | None:
        """The model tried first, or None when none is configured."""
        return self.models[0] if self.models else None


class Usage(NamedTuple):
    """Token counts as the provider reported them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """A model's answer, and how the route got it."""

    content: str
    tool_calls: list[dict[str, Any]]
    model: str
    """The model (as named in the route) that answered."""
    tried: tuple[tuple[str, str], ...]
    """``(model, error class)`` of each failed attempt before the answer."""
    usage: Usage
    latency_ms: float
    """Wall time of the whole call, failed attempts included."""
    finish_reason: str | None
    dropped: tuple[str, ...] = field(default=())
    """Optional parameters the answering model refused and was called again without."""


class Attempt(Protocol):
    """One model call under way, as a :class:`CallObserver` follows it."""

    def succeeded(self, usage: Usage, finish_reason: str | None) -> None:
        """The model answered."""
        ...

    def failed(self, error: str) -> None:
        """The call failed with an error of class ``error`` (the next model may be tried)."""
        ...


class CallObserver(Protocol):
    """What :func:`complete` tells of each model it tries: the runtime's metrics and spans
    (O1, O2), passed in so that this module imports none of them."""

    def attempt(self, agent: str, model: str) -> Attempt:
        """``model`` is about to be called for ``agent``."""
        ...


_edge: Any = None
"""litellm once imported and set up by :func:`_litellm`."""
_edge_lock = threading.Lock()
"""Held while litellm is imported: a call made during a :func:`preload` waits for it rather
than importing the same modules beside it."""


def _litellm() -> Any:
    """Import litellm on first use, without its network fetch or its stdout banners."""
    global _edge
    if _edge is None:
        with _edge_lock:
            if _edge is None:
                os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                litellm: Any = importlib.import_module("litellm")
                litellm.suppress_debug_info = True
                _edge = litellm
    return _edge


def preload() -> threading.Thread | None:
    """Start importing litellm in a background thread, so the first model call does not pay
    for it; None when it is loaded already. A failed import is logged, and the first call
    raises it again."""
    if _edge is not None:
        return None
    thread = threading.Thread(target=_preload, name="fermix-llm-preload", daemon=True)
    thread.start()
    return thread


def _preload() -> None:
    try:
        _litellm()
    # A thread's error would otherwise reach the terminal as a traceback; the first model
    # call repeats the import and raises this error where a caller handles it.
    except Exception as exc:  # noqa: BLE001
        logger.warning("litellm could not be loaded in the background: %s", exc)


def call_name(model: str, api_base: str | None, providers: Sequence[str]) -> str:
    """The name litellm gets: ``openai/`` is prefixed to a model sent to an ``api_base``
    when its first segment is not a litellm provider, so litellm uses its OpenAI-compatible
    client (``llama3`` -> ``openai/llama3``, ``meta-llama/Llama-3`` -> ``openai/meta-llama/...``).
    """
    if api_base is None or model.split("/", 1)[0] in providers:
        return model
    return f"openai/{model}"


def _can_pass(exc: BaseException, errors: Any) -> bool:
    """Whether the next model may succeed where this error stopped one (see module doc)."""
    passing = (errors.ContextWindowExceededError, errors.Timeout, errors.RateLimitError)
    if isinstance(exc, (*passing, errors.APIConnectionError)):
        return True
    # litellm maps some statuses to its generic APIError (a 403 does), so go by status
    status = getattr(exc, "status_code", None)
    return isinstance(status, int) and (status >= 500 or status in (408, 429))


_LITELLM_PREFIX = re.compile(r"^(?:(?:litellm\.)?\w+(?:Error|Timeout): ?)+")


def _describe(exc: BaseException, model: str, policy: TimeoutPolicy, litellm: Any) -> str:
    if isinstance(exc, litellm.exceptions.Timeout):
        return f"{model}: timed out after {policy.timeout_s:g} s ({policy.name} policy)"
    # litellm prefixes its class name twice ("litellm.RateLimitError: RateLimitError: ...")
    text = _LITELLM_PREFIX.sub("", " ".join(str(exc).split()))
    return f"{model}: {type(exc).__name__}: {text[:200]}"


def _api_key(route: Route) -> str | None:
    if route.api_key_env is not None:
        key = os.environ.get(route.api_key_env)
        if not key:
            raise ModelError(f"environment variable {route.api_key_env} (api_key_env) is not set")
        return key
    return NO_KEY if route.api_base is not None else None


def _refused_param(exc: BaseException, request: Mapping[str, Any], litellm: Any) -> str | None:
    """The optional parameter a bad request complains about, if it is one we sent."""
    errors = litellm.exceptions
    if not isinstance(exc, errors.BadRequestError) or isinstance(
        exc, errors.ContextWindowExceededError
    ):
        return None
    return next((p for p in OPTIONAL_PARAMS if p in request and p in str(exc)), None)


def _attempt(
    litellm: Any, request: dict[str, Any], errors: type[Exception]
) -> tuple[Any, tuple[str, ...]]:
    """Call one model, dropping each optional parameter it refuses (once)."""
    dropped: tuple[str, ...] = ()
    while True:
        try:
            return litellm.completion(**request), dropped
        except errors as exc:
            param = _refused_param(exc, request, litellm)
            if param is None:
                raise
            del request[param]
            dropped += (param,)


def complete(
    route: Route,
    messages: Sequence[Mapping[str, Any]],
    *,
    agent: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    response_format: Mapping[str, Any] | None = None,
    reasoning_effort: str | None = None,
    max_tokens: int | None = None,
    policy: TimeoutPolicy | None = None,
    metadata: Mapping[str, Any] | None = None,
    observer: CallObserver | None = None,
) -> Completion:
    """Ask the route's models in order for one buffered (non-streaming) answer.

    ``agent`` tags the call in litellm's metadata and in the log; ``observer`` is told of
    each model tried, its outcome and usage (the metrics and spans, O1, O2). ``policy``
    defaults to the route's (``llm_buffered``); its timeout bounds each attempt. Raises
    :class:`ModelRequestError` on an error no fallback can fix, :class:`ModelUnavailableError`
    naming every model and why when all fail, and :class:`ModelError` when no model is set.
    """
    if not route.models:
        raise ModelError(NO_MODEL_HINT)
    policy = policy or route.policy
    api_key = _api_key(route)
    litellm = _litellm()
    # every litellm error a provider can cause derives from openai's; others are bugs
    openai_error: type[Exception] = importlib.import_module("openai").OpenAIError
    options: dict[str, Any] = {
        "tools": [dict(tool) for tool in tools] if tools else None,
        "response_format": response_format,
        "reasoning_effort": reasoning_effort,
        "max_tokens": max_tokens,
    }
    tried: list[tuple[str, str]] = []
    reasons: list[str] = []
    last: Exception | None = None
    started = time.monotonic()
    for model in route.models:
        request = {
            "model": call_name(model, route.api_base, litellm.provider_list),
            "messages": [dict(m) for m in messages],
            "api_base": route.api_base,
            "api_key": api_key,
            "timeout": policy.timeout_s,
            "num_retries": 0,
            "metadata": {**(metadata or {}), "agent": agent},
            **{k: v for k, v in options.items() if v is not None},
        }
        watch = None if observer is None else observer.attempt(agent, model)
        try:
            response, dropped = _attempt(litellm, request, openai_error)
        except BaseException as exc:
            if watch is not None:
                watch.failed(type(exc).__name__)
            if not isinstance(exc, openai_error):
                raise
            tried.append((model, type(exc).__name__))
            reasons.append(_describe(exc, model, policy, litellm))
            if not _can_pass(exc, litellm.exceptions):
                _log(agent, "refused", model, tried, Usage(), (), _ms_since(started))
                raise ModelRequestError(
                    "; ".join(reasons) + " (an error no fallback can fix)", tuple(tried)
                ) from exc
            last = exc
            continue
        result = _completion(response, model, tuple(tried), dropped, _ms_since(started))
        if watch is not None:
            watch.succeeded(result.usage, result.finish_reason)
        _log(agent, "ok", model, tried, result.usage, dropped, result.latency_ms)
        return result
    _log(agent, "failed", None, tried, Usage(), (), _ms_since(started))
    raise ModelUnavailableError(
        f"every model failed ({policy.name} policy): " + "; ".join(reasons), tuple(tried)
    ) from last


def _ms_since(started: float) -> float:
    return (time.monotonic() - started) * 1000


def _completion(
    response: Any,
    model: str,
    tried: tuple[tuple[str, str], ...],
    dropped: tuple[str, ...],
    latency_ms: float,
) -> Completion:
    choice = response.choices[0]
    message = choice.message
    usage = getattr(response, "usage", None)
    return Completion(
        content=message.content or "",
        tool_calls=[call.model_dump() for call in message.tool_calls or ()],
        model=model,
        tried=tried,
        usage=Usage(*(getattr(usage, name, 0) or 0 for name in Usage._fields)),
        latency_ms=latency_ms,
        finish_reason=choice.finish_reason,
        dropped=dropped,
    )


def _log(
    agent: str,
    outcome: str,
    model: str | None,
    tried: Sequence[tuple[str, str]],
    usage: Usage,
    dropped: tuple[str, ...],
    latency_ms: float,
) -> None:
    """One line per call: ``key=value`` text, and the same fields as ``record.llm``."""
    fields = {
        "agent": agent,
        "outcome": outcome,
        "model": model or "-",
        "tried": ",".join(f"{m}:{error}" for m, error in tried) or "-",
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "latency_ms": round(latency_ms),
        "dropped": ",".join(dropped) or "-",
    }
    level = logging.INFO if outcome == "ok" else logging.WARNING
    text = "llm call " + " ".join(f"{k}=%s" for k in fields)
    logger.log(level, text, *fields.values(), extra={"llm": fields})


def context_window(route_or_model: Route | str | None, override: int | None = None) -> int | None:
    """The context window in tokens: ``override`` (config), else litellm's model table for
    the model (a route's primary), else None for a model litellm does not know."""
    if override is not None:
        return override
    model = route_or_model.primary if isinstance(route_or_model, Route) else route_or_model
    if model is None:
        return None
    try:
        info = _litellm().get_model_info(model)
    # litellm raises bare Exception subclasses for unknown models; a missing window means
    # "unknown", never a failed call.
    except Exception:  # noqa: BLE001
        return None
    window = info.get("max_input_tokens") if isinstance(info, Mapping) else None
    return window if isinstance(window, int) and window > 0 else None
