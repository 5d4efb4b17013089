"""Warren's broker: vhosts, exchanges, queues, channel sessions and the server."""
