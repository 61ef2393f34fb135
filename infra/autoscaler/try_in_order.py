"""The head autoscaler's choice among worker types that fit alike: the highest `priority` first, and a type
whose launch just failed after every other.

cluster/aws.yaml's head starts Ray's first autoscaler with this scorer (head_start_ray_commands):

    RAY_enable_autoscaler_v2=0 RAY_AUTOSCALER_UTILIZATION_SCORER=try_in_order.score \
    PYTHONPATH=/tmp/pong-build/infra/autoscaler ray start --head --autoscaling-config=~/ray_bootstrap_config.yaml

Why a scorer of our own: Ray's first autoscaler already records each failed launch by node type (the AWS node
provider tries every zone, then raises NodeLaunchException; NodeLauncher._launch_node hands it to the
NodeProviderAvailabilityTracker, which keeps it 30 minutes) and passes that record to the utilization scorer of
every candidate type (ResourceDemandScheduler.get_nodes_to_launch). Its default scorer ignores it
(resource_demand_scheduler._default_utilization_scorer), so among types of equal fit it asks again and again for
the same one, the one whose name sorts last (get_nodes_for), whether or not EC2 has any. Ray's second autoscaler
orders types by `priority` but lowers a type only when an instance it got never joins
(CloudResourceMonitor: ALLOCATION_TIMEOUT, after an hour), not when RunInstances fails. This scorer keeps Ray's
own score and adds the two things a spot cluster needs: a type that failed within the tracker's 30 minutes ranks
below every type that did not, and among the rest the higher `priority` of the YAML (Ray's own key of a node
type) wins. With cluster/aws.yaml's priorities, SPOT=1 asks for spot c5.9xlarge, then c5d, then c5n, and the
on-demand workers only when all three failed; a type is tried again once its failure is 30 minutes old.
RAY_AUTOSCALER_UTILIZATION_SCORER is Ray's hook for this (ray-project/ray#29144: "not an API yet"), so
tests/test_aws.py runs it inside Ray's own scheduler and launcher, on moto, against the Ray of the lock.
"""

import os

import yaml
from ray.autoscaler._private.resource_demand_scheduler import _default_utilization_scorer

# The config the head's autoscaler runs: the --autoscaling-config of cluster/aws.yaml's `ray start --head`,
# which `ray up` writes on the head (the YAML as bootstrapped, its node types in their order).
AUTOSCALING_CONFIG = "~/ray_bootstrap_config.yaml"

_read = {}  # path -> (modification time, {node type: priority})


def priorities(path=AUTOSCALING_CONFIG):
    """{node type: priority} of the autoscaling config, read again when the file changes (`ray up` again);
    {} when it cannot be read, which leaves Ray's own order."""
    path = os.path.expanduser(path)
    try:
        changed = os.stat(path).st_mtime
        if _read.get(path, (None,))[0] != changed:
            with open(path) as f:
                types = yaml.safe_load(f)["available_node_types"]
            _read[path] = (changed, {name: spec.get("priority", 0) for name, spec in types.items()})
        return _read[path][1]
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return {}


def score(node_resources, resources, node_type, *, node_availability_summary):
    """Ray's score of launching a node_type for these resources (None: it fits none of them), led by whether
    the type's last launch in the tracker's window succeeded and followed by its priority."""
    fit = _default_utilization_scorer(
        node_resources, resources, node_type, node_availability_summary=node_availability_summary
    )
    if fit is None:
        return None
    record = node_availability_summary.node_availabilities.get(node_type)
    return (record is None or record.is_available, *fit, priorities().get(node_type, 0))
