"""The global scheduler: ready completion tasks of every session, placed on engines.

- :mod:`.task`: a completion task (a chain whose inputs are ready) and its prompts;
- :mod:`.policy`: the scheduling policies, the queue's order and engine placement;
- :mod:`.queue`: the ready tasks, with their groups;
- :mod:`.slot`: an engine as the scheduler sees it (load, capacity, health, contexts);
- :mod:`.runner`: running one task on an engine (its requests, their errors, requeue);
- :mod:`.health`: the engine monitor (pings, down and up; asks for memory to be relieved);
- :mod:`.global_scheduler`: the dispatch loop that ties them together;
- :mod:`.snapshot`: what the rest of the ServeCore may read of it (engines, counters).

What the engines hold (contexts, leases, fill-ahead holds, eviction, frees) is owned by
:mod:`parrot.platform.serve.contexts.manager`, never changed here.
"""
