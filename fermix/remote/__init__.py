"""The memory server's Python client: ``fermix.Client`` (N1).

The same surface as an embedded :class:`fermix.Memory` and its conversations, each call one
HTTP request to the server that owns the home (``fermix supervisor start``):
:class:`Client` (with the admin calls of :class:`~fermix.remote.admin.AdminCalls`),
:class:`RemoteConversation`, and the transport beneath them.
"""

from fermix.remote.client import Client, RemoteTools
from fermix.remote.conversation import RemoteConversation

__all__ = ["Client", "RemoteConversation", "RemoteTools"]
