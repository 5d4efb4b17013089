import pika


def test_smoke(server, name):
    c = pika.BlockingConnection(pika.URLParameters(server.url))
    ch = c.channel()
    ch.queue_declare(name)
    ch.basic_publish("", name, b"x")
    assert ch.basic_get(name, auto_ack=True)[2] == b"x"
    c.close()
