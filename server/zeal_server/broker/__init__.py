"""Everything that speaks MQTT or NATS: the collector (subscription, the writer thread,
acknowledgement after commit), the door that sheds messages before they are queued, the
JetStream source, notices to devices, the stream configurations kept on the broker, the
collector id and the device logins of the broker's dynamic security plugin.
"""
