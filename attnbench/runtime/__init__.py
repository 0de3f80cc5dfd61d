"""How work runs, for both experiments: worker processes whose death is noticed
(:mod:`.processes`), Ray tasks retried once in a fresh process (:mod:`.ray_tasks`), shards, Ray's
start-up and fault injection (:mod:`.engines`), files written whole or not at all
(:mod:`.outputs`) and the TOML config reader (:mod:`.tomlconfig`). No torch here."""
