"""LoRaWAN through ChirpStack v4 (docs/lorawan.md): ``events`` reads its uplink events,
``source`` is the collector's subscription to them on ChirpStack's broker, and ``uplinks``
routes each by its binding and writes it as the batch its device would have sent."""
