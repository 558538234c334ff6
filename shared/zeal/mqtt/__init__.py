"""The MQTT transport of Zeal's batches: what the edge and the server share about the broker.

``topics``        the topic layout (the only module that writes it), notices, presence
``streamconfig``  a stream's configuration document and its tombstone, as retained on the broker
``brokerurl``     broker URLs and their settings, why a broker is unreachable
``client``        the one paho client factory, persistent sessions, batched acknowledgements

Only ``client`` imports paho-mqtt (the ``mqtt`` extra: ``pip install zeal[mqtt]``); nothing
outside this package imports paho (an import contract in pyproject.toml).
"""
