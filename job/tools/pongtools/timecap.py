"""A job's default time cap, from the plan: what `make run` and `make submit` give a job without MAX_HOURS.

The cap is the head's watcher's (infra/autodown.py stops the job then, as `make stop-job` does). Its default is
the seconds of one update at nodes x CPUs and the job's batch size, at the slowest stage of learning the plan
knows (so a resumed run, whose episodes are longer, fits too), times the job's updates; plus the floor, the
workers' bring-up in the plan (the head may train alone meanwhile) and the trainer's --actor-wait-s; all of it
times CAP_MARGIN, since the plan's figures are measured on other machines or assumed. A cap too short stops a
run that a resume continues from its checkpoint; one too long bills a hung job's cluster that long.
"""

import math

# The plan's seconds for the job, times this, for the plan's figures measured on other machines or assumed
# (make plan says each one's kind).
CAP_MARGIN = 2
# The most hours a time cap (MAX_HOURS) or a node's backstop (MAX_NODE_HOURS) may say: a week. A cluster left to
# run longer is one nobody watches; `1e9` or a slip of a zero is refused rather than billed.
HOURS_MOST = 168


def default_cap(trainer, nodes, cpus, path="build"):
    """The default time cap, in hours (up to 0.01 h), of a job with trainer's config (a pgpong Config, updates >
    0) on nodes x cpus whose image comes by path (the plan's build or pull), and the fields that say how."""
    from pongtools.plan import endtoend, inputs, model

    actors = nodes * cpus if trainer.workers == "auto" else min(nodes * cpus, int(trainer.workers))
    nodes, cpus = math.ceil(actors / cpus), min(cpus, actors)  # the nodes the job's actors fill
    _, stages = model.project(inputs.load_inputs(), nodes, cpus, trainer.batch_size)
    per_update = max(stage["update"]["seconds"] for stage in stages)
    parts, _ = endtoend.load()
    bring_up = endtoend.timeline(parts, nodes - 1, 0.0, path)["workers"][0]
    floor = bring_up + trainer.actor_wait_s
    capped = math.ceil(CAP_MARGIN * (floor + trainer.updates * per_update) / 36) / 100
    why = dict(updates=trainer.updates, seconds_per_update=per_update, nodes=nodes, cpus_per_node=cpus)
    return capped, {**why, "batch_size": trainer.batch_size, "floor_s": floor, "margin": CAP_MARGIN}
