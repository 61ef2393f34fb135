"""The plan as key=value lines: each answer first, then the inputs it used; and the prices it counts,
on demand and, for the workers, spot."""

import dataclasses

import yaml
from pgpong.cli import UserError
from pgpong.logline import kv, value

from ..prices import beside_instance
from . import endtoend, model


@dataclasses.dataclass
class Price:
    usd_per_node_hour: float  # all one node bills an hour: its instance, and beside it its volumes and IPv4 address
    instance_type: str
    region: str
    source: str
    instance_usd_per_hour: float | None = None  # the instance alone; None: a price given whole (--usd-per-node-hour)
    volumes_usd_per_hour: float = 0.0
    ipv4_usd_per_hour: float = 0.0

    @property
    def beside_usd_per_hour(self):
        """What a node bills beside its instance, spot or on demand alike."""
        return self.volumes_usd_per_hour + self.ipv4_usd_per_hour


def price_of(cluster_path, prices_path, instance_type=None, region=None):
    """The Price of a node of the head's node type of a cluster YAML (or of instance_type, `make up TYPE=`) in its
    region (or in region, `make plan REGION=`), from the price file `make preflight` reads too (infra/prices.yaml): its instance, and beside it its
    volumes and public IPv4 address counted as preflight counts them (pongtools.prices.beside_instance)."""
    try:
        with open(cluster_path) as f:
            config = yaml.safe_load(f)
        node_config = config["available_node_types"][config["head_node_type"]]["node_config"]
        region = region or config["provider"]["region"]
        head = instance_type or node_config["InstanceType"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise UserError(
            f"cannot read the head's InstanceType and provider.region from {cluster_path}; "
            "pass --usd-per-node-hour instead"
        ) from None
    try:
        with open(prices_path) as f:
            prices = yaml.safe_load(f)
        usd, source = prices["usd_per_hour"].get(region, {}).get(head), prices["source"]
        beside = beside_instance(node_config, region, prices)
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        raise UserError(f"cannot read the prices in {prices_path}; pass --prices or --usd-per-node-hour") from None
    if usd is None or beside is None:
        what = head if usd is None else f"the volumes of {head}"
        raise UserError(
            f"{prices_path} has no price for {what} in {region}, only in {', '.join(sorted(prices['usd_per_hour']))};"
            " pass --usd-per-node-hour (ARGS=), the on-demand price of AWS's EC2 pricing page plus a node's volume and IPv4"
        )
    return Price(usd + sum(beside), head, region, source, usd, *beside)


def given_price(usd):
    """A price named on the command line."""
    return Price(usd, "given", "given", "--usd-per-node-hour")


def report(inputs, inputs_path, result, stages, price, out=print):
    """Print a projection (model.project's result and stages) of these inputs at this price."""
    costs, learning = inputs["costs"], inputs["learning"]
    batch = result["batch_size"]
    out(
        kv(
            "plan",
            "projection",
            nodes=result["nodes"],
            cpus_per_node=result["cpus"],
            actors=result["actors"],
            batch_size=batch,
            inputs=inputs_path,
            samples_per_stage=result["samples"],
        )
    )
    for s in stages:
        u = s["update"]
        out(
            kv(
                "stage",
                first_episode=s["first_episode"],
                episodes=s["episodes"],
                running_reward=s["running_reward"],
                lengths_from=s["lengths_from"],
                len_mean=s["len_mean"],
                len_max=s["len_quantiles"][-1],
                seconds_per_update=u["seconds"],
                rollout_s=u["rollout_s"],
                broadcast_s=u["broadcast_s"],
                reduce_s=u["reduce_s"],
                rmsprop_s=u["rmsprop_s"],
            )
        )
    out(
        kv(
            seconds_per_update=result["seconds_per_update"],
            over="mean_over_updates_to_win" if result["hours_to_win"] else "first_stage",
            first_stage=result["seconds_per_update_first_stage"],
            last_stage=result["seconds_per_update_last_stage"],
            actors=result["actors"],
            batch_size=batch,
            core_env_steps_per_s=result["core_rate"],
            core_rate_source=result["core_rate_source"],
            reduce_per_node_s=costs["reduce_per_node_s"],
            fold_s=costs["fold_s"],
            broadcast_s=costs["broadcast_s"],
            rmsprop_s=costs["rmsprop_s"],
            network_gbps=result["network_gbps"],
            episode_lengths_source=learning["run"],
        )
    )
    out(
        kv(
            episodes_per_hour=result["episodes_per_hour"],
            seconds_per_update=result["seconds_per_update"],
            batch_size=batch,
        )
    )
    dollars_per_hour = price.usd_per_node_hour * result["nodes"]
    out(
        kv(
            dollars_per_hour=dollars_per_hour,
            nodes=result["nodes"],
            usd_per_node_hour=price.usd_per_node_hour,
            **(
                {}
                if price.instance_usd_per_hour is None
                else dict(
                    instance_usd_per_hour=price.instance_usd_per_hour,
                    volumes_usd_per_node_hour=price.volumes_usd_per_hour,
                    ipv4_usd_per_node_hour=price.ipv4_usd_per_hour,
                )
            ),
            instance_type=price.instance_type,
            region=price.region,
            price_source=price.source,
        )
    )
    win = {
        "episodes_to_win": learning.get("episodes_to_win"),
        "episodes_to_win_kind": learning["episodes_to_win_kind"],
        "episodes_to_win_source": learning["episodes_to_win_source"],
        "learned_at_batch_size": learning["batch_size"],
        "learned_at_learning_rate": learning["learning_rate"],
        "win_running_reward": learning["win_reward"],
        "lengths_source": learning["run"],
        "lengths_source_episodes": learning["episodes"],
    }
    known = result.get("updates_to_win_known") or {}
    measured = known.get("measured")
    if measured:  # a run of this batch size reached it: no assumption left
        win = {"updates_to_win_kind": "measured", "win_running_reward": learning["win_reward"]}
    elif learning["batch_size"] != batch:
        win["assumes"] = f"batch_{batch}_needs_the_episodes_batch_{learning['batch_size']}_needed"
    if known.get("at_least"):  # a run of this batch size went this far without reaching it
        win["at_least_updates"] = known["at_least"]
    if result["hours_to_win"] is None:
        out(kv(hours_to_win="unknown", reason=learning.get("episodes_to_win_note", "no_episodes_to_win"), **win))
        out(kv(dollars_to_win="unknown", dollars_per_hour=dollars_per_hour))
        return
    last = stages[-1]
    past = last["first_episode"] + last["episodes"]
    if not measured and learning["episodes_to_win"] > past:
        win["episodes_past_last_stage"] = learning["episodes_to_win"] - past  # they get the last stage's lengths
    out(kv(hours_to_win=result["hours_to_win"], updates_to_win=result["updates_to_win"], **win))
    out(
        kv(
            dollars_to_win=result["hours_to_win"] * dollars_per_hour,
            hours_to_win=result["hours_to_win"],
            dollars_per_hour=dollars_per_hour,
        )
    )
    if learning["batch_size"] != batch and not measured:
        hours = result["hours_to_win_same_updates"]
        out(
            kv(
                hours_to_win_if_same_updates=hours,
                updates_to_win=result["updates_to_win_same_updates"],
                assumes=f"batch_{batch}_needs_the_updates_batch_{learning['batch_size']}_needed",
                episodes_to_win_source=learning["episodes_to_win_source"],
                **({"at_least_updates": known["at_least"]} if known.get("at_least") else {}),
            )
        )
        out(
            kv(
                dollars_to_win_if_same_updates=hours * dollars_per_hour,
                hours_to_win_if_same_updates=hours,
                dollars_per_hour=dollars_per_hour,
            )
        )


@dataclasses.dataclass
class Spot:
    """Spot workers beside an on-demand head: their price, how often one is taken back, and what
    that costs in time (model.replay, model.NODE_START_S)."""

    usd_per_node_hour: float | None  # the instance's spot price; None: not given
    interruptions_per_node_hour: float
    workers: int  # the spot nodes: every node but the head
    replay_s: float  # what the update in flight loses, Ray's detection of the loss included
    replayed_episodes: float
    detect_s: float
    node_start_s: float
    start_s: float  # what the updates on one node fewer lose until the replacement plays
    seconds_per_update: float
    seconds_per_update_one_node_less: float
    beside_usd_per_node_hour: float = 0.0  # each node's volumes and IPv4 address, billed on spot as on demand

    @property
    def seconds_per_interruption(self):
        return self.replay_s + self.start_s

    @property
    def worker_usd_per_hour(self):
        """All a spot worker bills an hour: its spot price and what it bills beside its instance."""
        return self.usd_per_node_hour + self.beside_usd_per_node_hour

    def dollars_per_hour(self, head_usd_per_node_hour):
        return head_usd_per_node_hour + self.workers * self.worker_usd_per_hour


def spot(sp, price, hours, out=print):
    """Print what an interruption costs, the spot price, and the hours and dollars to a win with spot
    workers beside the on-demand ones (hours: {"": hours to win, "_if_same_updates": ...}, None if unknown)."""
    out(
        kv(
            "interruption",
            seconds=sp.seconds_per_interruption,
            replay_s=sp.replay_s,
            replayed_episodes=sp.replayed_episodes,
            detect_s=sp.detect_s,
            detect_kind="upper_bound_from_ray_health_checks",
            start_s=sp.start_s,
            node_start_s=sp.node_start_s,
            node_start_kind="estimate_lower_bound",
            seconds_per_update=sp.seconds_per_update,
            seconds_per_update_one_node_less=sp.seconds_per_update_one_node_less,
        )
    )
    if sp.usd_per_node_hour is None:
        out(
            kv(
                "spot",
                usd_per_node_hour="unknown",
                reason="pass --spot-usd-per-node-hour (make preflight SPOT=1 prints the spot price of each zone)",
            )
        )
        return
    dollars_per_hour = sp.dollars_per_hour(price.usd_per_node_hour)
    out(
        kv(
            "spot",
            usd_per_node_hour=sp.usd_per_node_hour,
            spot_nodes=sp.workers,
            beside_usd_per_node_hour=sp.beside_usd_per_node_hour,
            dollars_per_hour=dollars_per_hour,
            head_usd_per_node_hour=price.usd_per_node_hour,
            interruptions_per_node_hour=sp.interruptions_per_node_hour,
            price_source="--spot-usd-per-node-hour",
        )
    )
    for suffix, uninterrupted in hours.items():
        if uninterrupted is None:
            out(kv(**{f"dollars_to_win_spot{suffix}": "unknown"}, reason="hours_to_win_unknown"))
            continue
        spot_hours = model.spot_hours(
            uninterrupted, sp.interruptions_per_node_hour, sp.workers, sp.seconds_per_interruption
        )
        if spot_hours is None:
            out(kv(**{f"dollars_to_win_spot{suffix}": "never"}, reason="interruptions_cost_all_the_time_they_leave"))
            continue
        out(
            kv(
                **{f"dollars_to_win_spot{suffix}": spot_hours * dollars_per_hour},
                **{f"hours_to_win_spot{suffix}": spot_hours},
                interruptions=sp.interruptions_per_node_hour * sp.workers * spot_hours,
                **{f"dollars_to_win_on_demand{suffix}": uninterrupted * price.usd_per_node_hour * (sp.workers + 1)},
                **{f"hours_to_win{suffix}": uninterrupted},
            )
        )


def span(values):
    """A figure of several seeds' runs as kv writes it: "lo..hi", or the one value when they agree."""
    lo, hi = min(values), max(values)
    return lo if lo == hi else f"{value(lo)}..{value(hi)}"


def seeds_of(reading):
    return ",".join(str(s) for s in reading["seeds"])


def milestone(name, batch_size, readings, dollars_per_hour, out=print, sp=None, head_usd_per_node_hour=None):
    """One line per reading of the updates to a milestone (milestones.updates_to), with its hours and dollars;
    and with spot workers (sp, a Spot whose price is known) the hours and dollars at their price too. Several
    seeds' runs give each figure as their range, lo..hi, and name the seeds."""
    if not readings:
        out(kv("milestone", name=name, batch_size=batch_size, updates="unknown", reason="no_run_reached_it"))
    for r in readings:
        hours = [s / 3600 for s in r["seconds"]]
        on_spot = {}
        if sp is not None and sp.usd_per_node_hour is not None:
            h = [
                model.spot_hours(x, sp.interruptions_per_node_hour, sp.workers, sp.seconds_per_interruption)
                for x in hours
            ]
            on_spot = (
                {
                    "hours_spot": span(h),
                    "dollars_spot": span([x * sp.dollars_per_hour(head_usd_per_node_hour) for x in h]),
                }
                if None not in h
                else {"hours_spot": "never"}
            )
        unreached = r.get("unreached", [])
        out(
            kv(
                "milestone",
                name=name,
                batch_size=batch_size,
                updates=span(r["updates"]),
                seeds=seeds_of(r),
                episodes=span([u * batch_size for u in r["updates"]]),
                kind=r["kind"],
                hours=span(hours),
                dollars=span([x * dollars_per_hour for x in hours]),
                **on_spot,
                **({"at_least_updates": r["at_least"]} if "at_least" in r else {}),
                **({"not_yet_seeds": ",".join(str(s) for s, _ in unreached)} if unreached else {}),
                **({"not_yet_after_updates": ",".join(str(u) for _, u in unreached)} if unreached else {}),
                from_batch_size=r["from_batch_size"],
                run=",".join(r["runs"]),
            )
        )


def end_to_end(line, path, parts, workers, price, reading, out=print, sp=None):
    """The end_to_end line of a path (build, pull): endtoend.timeline's parts in order, each `<part>_s=` and
    `<part>_kind=`; the seconds from `make up` to the agent on the laptop (agent_s, all but the teardown); the
    hours and dollars EC2 bills, to the teardown's terminate, on demand and, given a spot price, with the workers
    at it; and whether issue 44's goal is met on demand."""
    figures = {}
    for name, (seconds, kind) in line.items():
        figures |= {f"{name}_s": float(seconds), f"{name}_kind": kind}
        if name == "workers":
            join = parts["worker_join"]
            figures |= {"workers": workers, "workers_join_s": float(join["seconds"]), "workers_join_kind": join["kind"]}
        if name == "train":
            most = max(reading["updates"])  # the seed that needed the most updates: the budget
            figures |= {"train_updates": most, "train_updates_kind": reading["kind"], "seeds": seeds_of(reading)}
    hours, dollars = endtoend.cost(line, workers, price.usd_per_node_hour, price.usd_per_node_hour)
    agent_s, agent_kind = endtoend.to_agent(line)
    on_spot = {}
    if sp is not None and sp.usd_per_node_hour is not None:
        train_h = model.spot_hours(
            line["train"][0] / 3600, sp.interruptions_per_node_hour, sp.workers, sp.seconds_per_interruption
        )
        if train_h is None:
            on_spot = {"hours_spot": "never"}
        else:
            spot_line = line | {"train": (train_h * 3600, line["train"][1])}
            h, d = endtoend.cost(spot_line, workers, price.usd_per_node_hour, sp.worker_usd_per_hour)
            on_spot = {"hours_spot": h, "dollars_spot": d, "spot_usd_per_node_hour": sp.usd_per_node_hour}
    out(
        kv(
            "end_to_end",
            path=path,
            **figures,
            down_until="terminate_instances",
            agent_s=agent_s,
            agent_kind=agent_kind,
            agent_min=agent_s / 60,
            hours=hours,
            dollars=dollars,
            usd_per_node_hour=price.usd_per_node_hour,
            **on_spot,
            goal_min=endtoend.GOAL_MIN,
            goal_usd=endtoend.GOAL_USD,
            met=endtoend.met(agent_s, dollars),
            order="head_then_workers_in_parallel",
        )
    )


def end_to_end_parts(parts, figures, out=print):
    """One end_to_end_part line per part of the end_to_end lines, with its command, source, basis or terms
    (a projected part's sum, written out), then one end_to_end_figure line per figure those terms name."""
    for name in endtoend.NEEDED:
        p = parts[name]
        why = "terms" if "terms" in p else endtoend.WHY[p["kind"]]  # a projected part's kind is its weakest figure's
        said = formula(p["terms"]) if why == "terms" else p[why]
        out(
            kv(
                "end_to_end_part",
                part=name,
                seconds=float(p["seconds"]),
                kind=p["kind"],
                what=p["what"],
                **{why: said},
                **({"caveat": p["caveat"]} if p.get("caveat") else {}),
            )
        )
    for name, f in figures.items():
        why = endtoend.WHY[f["kind"]]
        out(
            kv(
                "end_to_end_figure",
                figure=name,
                value=f["value"],
                kind=f["kind"],
                what=f["what"],
                **{why: f[why]},
                **({"caveat": f["caveat"]} if f.get("caveat") else {}),
            )
        )


def formula(terms):
    """A projected part's terms as a sum: `a + (b + c) / d`."""
    said = []
    for term in terms:
        if isinstance(term, str):
            said.append(term)
            continue
        megabytes, rate = term
        top = " + ".join(megabytes) if isinstance(megabytes, list) else megabytes
        said.append(f"({top}) / {rate}" if isinstance(megabytes, list) and len(megabytes) > 1 else f"{top} / {rate}")
    return " + ".join(said)


def size(nodes, cpus, reading, lines, costs, out=print):
    """The size line of one cluster size: its training to the play criterion (projected), and on each path
    (lines: {path: endtoend.timeline}; costs: {path: {hours, dollars, agent_s}}) the seconds of `make up` until
    the workers have joined and until the agent is on the laptop, each with the kind of its weakest part, the
    hours and dollars EC2 bills, and whether issue 44's goal is met."""
    any_line = next(iter(lines.values()))
    by_path = {}
    for path, line in lines.items():
        up = [part for part in line if part not in ("train", "fetch_ship", "down")]
        by_path |= {
            f"{path}_up_s": sum(line[p][0] for p in up),
            f"{path}_up_kind": endtoend.weakest(line[p][1] for p in up if line[p][1] != "none"),
            f"{path}_agent_s": costs[path]["agent_s"],
            f"{path}_agent_kind": endtoend.to_agent(line)[1],
            f"{path}_hours": costs[path]["hours"],
            f"{path}_dollars": costs[path]["dollars"],
            f"{path}_met": endtoend.met(costs[path]["agent_s"], costs[path]["dollars"]),
        }
    out(
        kv(
            "size",
            nodes=nodes,
            cpus_per_node=cpus,
            actors=nodes * cpus,
            train_updates=max(reading["updates"]),
            train_updates_kind=reading["kind"],
            train_s=float(any_line["train"][0]),
            train_kind=any_line["train"][1],
            fetch_ship_s=float(any_line["fetch_ship"][0]),
            fetch_ship_kind=any_line["fetch_ship"][1],
            down_s=float(any_line["down"][0]),
            down_kind=any_line["down"][1],
            **by_path,
        )
    )


def sizes(path, cheapest, fastest, cpus, price, out=print):
    """Which of the sizes costs the least (dollars billed) and which has the agent on the laptop soonest, to the
    play criterion, on a path, on demand."""
    out(
        kv(
            "sizes",
            path=path,
            cheapest_nodes=cheapest["nodes"],
            cheapest_agent_s=cheapest["agent_s"],
            cheapest_agent_kind=cheapest["agent_kind"],
            cheapest_dollars=cheapest["dollars"],
            fastest_nodes=fastest["nodes"],
            fastest_agent_s=fastest["agent_s"],
            fastest_agent_kind=fastest["agent_kind"],
            fastest_dollars=fastest["dollars"],
            cpus_per_node=cpus,
            usd_per_node_hour=price.usd_per_node_hour,
            to="play_criterion",
        )
    )
