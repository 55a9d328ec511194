"""What an operator sees and steers: registry heartbeat, control channel, metrics, health,
sd_notify and the status file. Observes ``plaita.runtime`` through its observer interface."""
