"""python -m pongtools.plan {project,inputs,calibrate,probe}: see __init__.py. A mistake is one line, exit 2."""

from pgpong.cli import Parser, UserError, at_least, checked, non_negative, positive, run
from pgpong.logline import kv

from . import calibration, endtoend, inputs, milestones, model, output

# The sizes `make plan` compares: the head alone and a few up to one wave of 300 episodes on 18 cores
# (17 x 18 = 306 actors), the default 11 among them.
SIZES = (2, 6, 11, 17)


def node_counts(text):
    """Distinct whole numbers >= 1, comma-separated, in order; or ValueError."""
    counts = [int(n) for n in text.split(",")]
    if not counts or min(counts) < 1 or len(set(counts)) < len(counts):
        raise ValueError
    return sorted(counts)


def parser():
    p = Parser(prog="python -m pongtools.plan", description=__doc__.split(":")[0])
    sub = p.add_subparsers(required=True, metavar="{project,inputs,calibrate,probe}")

    q = sub.add_parser("project", help="project a cluster: seconds per update, $ an hour, hours and $ to a win")
    q.add_argument("--nodes", type=at_least(1), default=11, help="nodes of the cluster (default 11)")
    q.add_argument("--cpus", type=at_least(1), default=18, help="CPUs per node, one rollout actor each (default 18)")
    q.add_argument("--batch-size", type=at_least(1), default=300, help="episodes per update (default 300)")
    q.add_argument(
        "--cluster", default="cluster/aws.yaml", help="cluster YAML whose head instance type and region set the price"
    )
    q.add_argument(
        "--instance-type", help="price nodes of this instance type (make up TYPE=) in the cluster YAML's region"
    )
    q.add_argument("--region", help="price nodes in this AWS region (make REGION=) instead of the cluster YAML's")
    q.add_argument("--prices", default="infra/prices.yaml", help="the price file (default infra/prices.yaml)")
    q.add_argument(
        "--usd-per-node-hour",
        type=checked(positive, "a price in USD > 0"),
        help="all one node bills an hour, instead of the cluster YAML's instance, volumes and IPv4 address",
    )
    q.add_argument(
        "--spot-usd-per-node-hour",
        type=checked(positive, "a price in USD > 0"),
        help="spot price of one worker node an hour (make preflight SPOT=1 prints it); the head stays on demand",
    )
    q.add_argument(
        "--interruptions-per-node-hour",
        type=checked(non_negative, "a number >= 0"),
        default=0.0,
        help="how often EC2 takes a spot worker back, per node-hour (default 0)",
    )
    q.add_argument(
        "--detect-s",
        type=checked(non_negative, "a number of seconds >= 0"),
        default=model.DETECT_S,
        help=f"seconds until Ray declares a lost node dead (default {model.DETECT_S:g}, from Ray's health checks: "
        "see model.DETECT_S)",
    )
    q.add_argument(
        "--node-start-s",
        type=checked(non_negative, "a number of seconds >= 0"),
        default=model.NODE_START_S,
        help=f"seconds until a replacement node's actors play, image build included (default {model.NODE_START_S:g}, "
        "an estimate: see model.NODE_START_S)",
    )
    rate = q.add_mutually_exclusive_group()
    rate.add_argument(
        "--core-rate",
        type=checked(positive, "agent steps/s > 0"),
        help="agent steps/s of one core, instead of the inputs' one",
    )
    rate.add_argument(
        "--measure-core",
        type=at_least(1),
        nargs="?",
        const=40,
        metavar="SECONDS",
        help="measure this machine's core rate now as the trainer gets it: one trainer update, an actor on every "
        "core, of about SECONDS (default 40; Ray starts here)",
    )
    q.add_argument(
        "--network-gbps",
        type=checked(positive, "Gbit/s > 0"),
        default=model.NETWORK_GBPS,
        help=f"one flow between nodes, Gbit/s (default {model.NETWORK_GBPS:g})",
    )
    q.add_argument("--inputs", default=inputs.INPUTS, help="the measured inputs (default: plan_inputs.json beside it)")
    q.add_argument(
        "--end-to-end-inputs",
        default=endtoend.INPUTS,
        help="the seconds of each part from `make up` to `make down` (default: end_to_end_inputs.json beside it)",
    )
    q.add_argument(
        "--samples", type=at_least(1), default=200, help="simulated updates per stage of learning (default 200)"
    )
    q.add_argument("--seed", type=at_least(0), default=0, help="seeds the episode lengths drawn")
    q.add_argument(
        "--sizes",
        type=checked(node_counts, "node counts >= 1, comma-separated, such as 2,6,11,17"),
        default=SIZES,
        help=f"the cluster sizes (nodes of --cpus) whose end-to-end hours and dollars to the play criterion "
        f"`make plan` compares, naming the cheapest and the fastest (default {','.join(map(str, SIZES))})",
    )
    q.set_defaults(command=project)

    i = sub.add_parser("inputs", help="rebuild the inputs: the learning part from a run, the rest from a calibration")
    i.add_argument("--run", help="a run dir (a folder, s3://..., or an exported run): the learning part")
    i.add_argument("--calibration", help="a `calibrate` JSON: the core rate and the costs")
    i.add_argument(
        "--milestones",
        action="append",
        default=[],
        help="a run whose milestones (updates to a running reward of 0 and +2) stand for its batch size; repeatable",
    )
    i.add_argument(
        "--play-update",
        type=at_least(1),
        help="the update of the last --milestones run whose checkpoint met the play criterion",
    )
    i.add_argument("--play-source", help="where those games are recorded (with --play-update)")
    i.add_argument("--bench", help="the saved output of a quiet `make bench`: its trainer phase gives the core rate")
    i.add_argument("--fresh", help="a run dir whose first update gives a fresh policy's episode lengths (update 1's)")
    i.add_argument("--inputs", default=inputs.INPUTS, help="the file to rebuild (default: plan_inputs.json)")
    i.set_defaults(command=rebuild)

    c = sub.add_parser("calibrate", help="measure the trainer and a probe here (Ray; about half an hour)")
    c.add_argument("--out", required=True, help="the calibration JSON to write")
    c.add_argument("--work-dir", required=True, help="where the trainer's run dirs and the probe's log go")
    c.add_argument("--batch10-updates", type=at_least(0), default=20, help="updates of the batch-10 run (0: none)")
    c.add_argument("--batch300-updates", type=at_least(0), default=2, help="updates of the batch-300 run (0: none)")
    c.set_defaults(command=calibrate)

    r = sub.add_parser("probe", help="play episodes until SIGTERM, one line each into --log (calibrate runs it)")
    r.add_argument("--log", required=True)
    r.add_argument("--niceness", type=int, default=0, help="run at this niceness, as the actors it stands for")
    r.set_defaults(command=probe)
    return p


def project(a):
    found = milestones.win_from(inputs.load_inputs(a.inputs), a.batch_size)
    parts = endtoend.load(a.end_to_end_inputs)
    if a.measure_core:
        found["core"] = calibration.measure_core(a.measure_core)
        print(kv("core", **found["core"]), flush=True)
    if a.usd_per_node_hour is not None:
        price = output.given_price(a.usd_per_node_hour)
    else:
        price = output.price_of(a.cluster, a.prices, a.instance_type, a.region)
    args = (a.core_rate, a.network_gbps, a.samples, a.seed)
    known = milestones.known(found.get("milestones", {}), a.batch_size, "running_reward_0")
    result, stages = model.project(found, a.nodes, a.cpus, a.batch_size, *args, known=known)
    output.report(found, a.inputs, result, stages, price)
    sp = spot_workers(a, found, result, stages, args, known, price) if a.nodes > 1 else None
    if sp:
        hours = {"": result["hours_to_win"]}
        if found["learning"]["batch_size"] != a.batch_size and result["hours_to_win_same_updates"] is not None:
            hours["_if_same_updates"] = result["hours_to_win_same_updates"]
        output.spot(sp, price, hours)
    else:
        print(kv("spot", spot_nodes=0, reason="one node is the head alone, on demand: no worker to put on spot"))
    for name in milestones.NAMES:
        readings = milestones.updates_to(found.get("milestones", {}), a.batch_size, name)
        for r in readings:  # same updates: played as the other batch size's run played after as many
            per = r["from_batch_size"] if r["kind"] == "assumed_same_updates" else a.batch_size
            r["seconds"] = [model.seconds_for_updates(stages, per, u) for u in r["updates"]]
        dollars_per_hour = result["nodes"] * price.usd_per_node_hour
        output.milestone(
            name, a.batch_size, readings, dollars_per_hour, sp=sp, head_usd_per_node_hour=price.usd_per_node_hour
        )
        if name == "play_criterion":
            end_to_end(a, parts, readings, price, sp)
            sizes(a, found, parts[0], price, args, known, stages)


def end_to_end(a, parts, readings, price, sp):
    """The end_to_end lines of each reading of the updates to the play criterion, `make up` to the agent here and
    the bill to the teardown's terminate, one a path (build, pull); then each part's and figure's line."""
    if not readings:
        print(kv("end_to_end", train_s="unknown", hours="unknown", reason="no_run_reached_the_play_criterion"))
    for r in readings:  # the training of the seed that needed the most updates
        for path in endtoend.PATHS:
            line = endtoend.timeline(parts[0], a.nodes - 1, max(r["seconds"]), path)
            output.end_to_end(line, path, parts[0], a.nodes - 1, price, r, sp=sp)
    output.end_to_end_parts(*parts)


def sizes(a, found, parts, price, args, known, stages):
    """One size line for each of --sizes at --cpus a node, on demand, to the play criterion: from `make up` to the
    agent, and the bill (the budget: the seed that needed the most updates, of the first reading), both paths;
    then, for each path, the cheapest size and the one whose agent comes soonest."""
    readings = milestones.updates_to(found.get("milestones", {}), a.batch_size, "play_criterion")
    if not readings:
        print(kv("sizes", train_s="unknown", reason="no_run_reached_the_play_criterion"))
        return
    r = readings[0]
    per = r["from_batch_size"] if r["kind"] == "assumed_same_updates" else a.batch_size
    rows = {path: [] for path in endtoend.PATHS}
    for nodes in a.sizes:
        at = stages if nodes == a.nodes else model.project(found, nodes, a.cpus, a.batch_size, *args, known=known)[1]
        train_s = max(model.seconds_for_updates(at, per, u) for u in r["updates"])
        lines = {path: endtoend.timeline(parts, nodes - 1, train_s, path) for path in endtoend.PATHS}
        for path, line in lines.items():
            hours, dollars = endtoend.cost(line, nodes - 1, price.usd_per_node_hour, price.usd_per_node_hour)
            agent_s, agent_kind = endtoend.to_agent(line)
            rows[path].append(
                {"nodes": nodes, "hours": hours, "dollars": dollars, "agent_s": agent_s, "agent_kind": agent_kind}
            )
        output.size(nodes, a.cpus, r, lines, {path: got[-1] for path, got in rows.items()})
    for path, got in rows.items():
        output.sizes(path, *endtoend.cheapest_and_fastest(got), a.cpus, price)


def spot_workers(a, found, result, stages, args, known, price):
    """The Spot of this projection: every node but the head on spot, what losing one costs."""
    rate = result["core_rate"]
    target = result["updates_to_win"] and result["updates_to_win"] * a.batch_size  # the episodes to win here
    replay_s, replayed = model.replay(
        stages, a.nodes, a.cpus, a.batch_size, rate, target, a.detect_s, a.samples, a.seed
    )
    fewer, _ = model.project(found, a.nodes - 1, a.cpus, a.batch_size, *args, known=known)  # the same updates
    slower = 1 - result["seconds_per_update"] / fewer["seconds_per_update"]
    return output.Spot(
        usd_per_node_hour=a.spot_usd_per_node_hour,
        interruptions_per_node_hour=a.interruptions_per_node_hour,
        workers=a.nodes - 1,
        replay_s=replay_s,
        replayed_episodes=replayed,
        detect_s=a.detect_s,
        node_start_s=a.node_start_s,
        start_s=a.node_start_s * slower,
        seconds_per_update=result["seconds_per_update"],
        seconds_per_update_one_node_less=fewer["seconds_per_update"],
        beside_usd_per_node_hour=price.beside_usd_per_hour,
    )


def rebuild(a):
    if a.play_update is not None and not a.milestones:
        raise UserError("--play-update needs --milestones <the run whose checkpoint was played>")
    if not (a.run or a.calibration or a.milestones or a.bench or a.fresh):
        raise UserError(
            "pass --run <run dir>, --calibration <file>, --milestones <run dir>, --bench <log>, --fresh <run dir>, "
            "or several"
        )
    built = inputs.build_inputs(
        a.inputs, a.run, a.calibration, a.milestones, a.play_update, a.play_source, a.bench, a.fresh
    )
    if a.fresh:
        fresh = built["fresh"]
        print(kv("fresh", run=fresh["run"], update=1, episodes=fresh["episodes"], len_mean=fresh["len_mean"]))
    if a.bench:
        print(kv("core", **{k: v for k, v in built["core"].items() if k != "bench"}))
    for batch, runs in sorted(built.get("milestones", {}).items(), key=lambda item: int(item[0])):
        for found in runs:
            reached = {n: (found[n] or {}).get("update", "not_yet") for n in milestones.NAMES}
            measured_to = found["measured_to"]["update"]
            seed = milestones.seed_of(found)
            print(kv("milestones", batch_size=batch, seed=seed, measured_to=measured_to, run=found["run"], **reached))
    if not a.run and not a.calibration:
        return
    ln = built["learning"]
    print(
        kv(
            "inputs",
            path=a.inputs,
            run=ln["run"],
            episodes=ln["episodes"],
            stages=len(ln["stages"]),
            running_reward_last=ln["running_reward_last"],
            episodes_to_win=ln.get("episodes_to_win"),
            episodes_to_win_kind=ln["episodes_to_win_kind"],
        )
    )


def calibrate(a):
    calibration.calibrate(a.out, a.work_dir, ((10, a.batch10_updates), (300, a.batch300_updates)))


def probe(a):
    calibration.probe(a.log, a.niceness)


def main(argv=None):
    args = parser().parse_args(argv)
    args.command(args)


def entry():
    """`python -m pongtools.plan`: main under the one exit contract (pgpong.cli.run)."""
    run(main)


if __name__ == "__main__":
    entry()
