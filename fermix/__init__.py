"""fermix: durable conversation memory and long-term user facts for chat-bot hosts."""
