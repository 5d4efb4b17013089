"""Sans-I/O AMQP 0-9-1: frame parsing, connection state, hot-path codecs."""
