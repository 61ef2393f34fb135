"""The plan as key=value lines: each answer first, then the inputs it used; and the price it counts."""

import dataclasses

import yaml
from pgpong.logline import kv

from . import PlanError


@dataclasses.dataclass
class Price:
    usd_per_node_hour: float
    instance_type: str
    region: str
    source: str


def price_of(cluster_path, prices_path):
    """The Price of the head node type of a cluster YAML, from the price file `make preflight`
    reads too (infra/prices.yaml)."""
    try:
        with open(cluster_path) as f:
            config = yaml.safe_load(f)
        head = config["available_node_types"][config["head_node_type"]]["node_config"]["InstanceType"]
        region = config["provider"]["region"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        raise PlanError(
            f"cannot read the head's InstanceType and provider.region from {cluster_path}; "
            "pass --usd-per-node-hour instead"
        ) from None
    try:
        with open(prices_path) as f:
            prices = yaml.safe_load(f)
        usd, source = prices["usd_per_hour"].get(region, {}).get(head), prices["source"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        raise PlanError(f"cannot read the prices in {prices_path}; pass --prices or --usd-per-node-hour") from None
    if usd is None:
        raise PlanError(f"{prices_path} has no price for {head} in {region}; pass --usd-per-node-hour")
    return Price(usd, head, region, source)


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
    if learning["batch_size"] != batch:
        win["assumes"] = f"batch_{batch}_needs_the_episodes_batch_{learning['batch_size']}_needed"
    if result["hours_to_win"] is None:
        out(kv(hours_to_win="unknown", reason=learning.get("episodes_to_win_note", "no_episodes_to_win"), **win))
        out(kv(dollars_to_win="unknown", dollars_per_hour=dollars_per_hour))
        return
    last = stages[-1]
    past = last["first_episode"] + last["episodes"]
    if learning["episodes_to_win"] > past:
        win["episodes_past_last_stage"] = learning["episodes_to_win"] - past  # they get the last stage's lengths
    out(kv(hours_to_win=result["hours_to_win"], updates_to_win=result["updates_to_win"], **win))
    out(
        kv(
            dollars_to_win=result["hours_to_win"] * dollars_per_hour,
            hours_to_win=result["hours_to_win"],
            dollars_per_hour=dollars_per_hour,
        )
    )
    if learning["batch_size"] != batch:
        hours = result["hours_to_win_same_updates"]
        out(
            kv(
                hours_to_win_if_same_updates=hours,
                updates_to_win=result["updates_to_win_same_updates"],
                assumes=f"batch_{batch}_needs_the_updates_batch_{learning['batch_size']}_needed",
                episodes_to_win_source=learning["episodes_to_win_source"],
            )
        )
        out(
            kv(
                dollars_to_win_if_same_updates=hours * dollars_per_hour,
                hours_to_win_if_same_updates=hours,
                dollars_per_hour=dollars_per_hour,
            )
        )


def milestone(name, batch_size, readings, dollars_per_hour, out=print):
    """One line per reading of the updates to a milestone (milestones.updates_to), with its hours and dollars."""
    if not readings:
        out(kv("milestone", name=name, batch_size=batch_size, updates="unknown", reason="no_run_reached_it"))
    for r in readings:
        hours = r["seconds"] / 3600
        out(
            kv(
                "milestone",
                name=name,
                batch_size=batch_size,
                updates=r["updates"],
                episodes=r["updates"] * batch_size,
                kind=r["kind"],
                hours=hours,
                dollars=hours * dollars_per_hour,
                **({"at_least_updates": r["at_least"]} if "at_least" in r else {}),
                from_batch_size=r["from_batch_size"],
                run=r["run"],
            )
        )
