"""How work runs, for both experiments: units, listed and sharded (:mod:`.units`) and run, each
in a worker process or as a Ray task, retried once, with progress and Ctrl-C handled alike
(:mod:`.execute`, the one way to run units); worker processes whose death is noticed
(:mod:`.processes`), Ray tasks retried once in a fresh process (:mod:`.ray_tasks`), shards, Ray's
start-up and fault injection (:mod:`.engines`), files written whole or not at all
(:mod:`.outputs`), progress events (:mod:`.progress`) and log messages (:mod:`.logs`) that only
the command line draws, and the config files: their TOML reader (:mod:`.tomlconfig`) and schema
language (:mod:`.schema`). No torch here."""
