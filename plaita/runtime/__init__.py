"""The worker daemon: the owner loop driving the FSM, the handler pool, the settler and the
lease renewer. Talks to Redis only through ``plaita.store``; never imports ``plaita.ops``."""
