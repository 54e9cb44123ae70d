"""The controller: observe -> plan (pure) -> act, once per tick."""
