"""fermix: durable conversation memory and long-term user facts for chat-bot hosts.

The public API is what this module exports; everything else is reachable but not promised::

    from fermix import Memory

    with Memory() as memory:                       # ~/.fermix, or $FERMIX_HOME
        conv = memory.conversation("assistant", "telegram", "12345", owner_id="alice")
        conv.append_user("I moved to Porto last month")
        messages = conv.compose(system="You are a helpful assistant.")
        ...                                        # call your model with messages
        conv.commit(reply, usage={"prompt_tokens": 1234})
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fermix.api import Memory
    from fermix.config import Config, load_config
    from fermix.conversation import Conversation
    from fermix.errors import (
        AccessDeniedError,
        ActorUnavailableError,
        ConfigError,
        FermixError,
        InvalidInputError,
        ModelError,
        NotFoundError,
        SchemaTooNewError,
        StorageError,
        WriteFailedError,
    )
    from fermix.home import Home
    from fermix.model import ConversationKey, JobCaller, Message
    from fermix.remote import Client
    from fermix.surface import ConversationSurface, MemorySurface, ToolsSurface

# Exported names are imported on first use, so ``fermix memory list`` and other commands
# that need no actor or model start fast.
_HOMES = {
    "Memory": "fermix.api",
    "Client": "fermix.remote",
    "Config": "fermix.config",
    "Home": "fermix.home",
    "load_config": "fermix.config",
    "Conversation": "fermix.conversation",
    "ConversationKey": "fermix.model",
    "Message": "fermix.model",
    "JobCaller": "fermix.model",
    "JobRun": "fermix.model",
    "MemoryRow": "fermix.model",
    "ScheduledJob": "fermix.model",
    "ConversationSurface": "fermix.surface",
    "MemorySurface": "fermix.surface",
    "ToolsSurface": "fermix.surface",
}


def __getattr__(name: str) -> Any:
    import importlib

    module = _HOMES.get(name, "fermix.errors" if name.endswith("Error") else None)
    if module is None or name not in __all__:
        raise AttributeError(f"module 'fermix' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AccessDeniedError",
    "ActorUnavailableError",
    "Client",
    "Config",
    "ConfigError",
    "Conversation",
    "ConversationKey",
    "ConversationSurface",
    "FermixError",
    "Home",
    "InvalidInputError",
    "JobCaller",
    "JobRun",
    "Memory",
    "MemoryRow",
    "MemorySurface",
    "Message",
    "ModelError",
    "NotFoundError",
    "ScheduledJob",
    "SchemaTooNewError",
    "StorageError",
    "ToolsSurface",
    "WriteFailedError",
    "load_config",
]
