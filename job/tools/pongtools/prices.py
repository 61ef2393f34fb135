"""What one node bills an hour beside its instance, from infra/prices.yaml: the one formula that `make preflight`
(infra/preflight.py, check=cost) and `make plan` (pongtools.plan, dollars_per_hour) both count with."""


def beside_instance(node_config, region, prices):
    """(volumes, public IPv4) in USD an hour of one node beside its instance, from infra/prices.yaml: each EBS
    volume of its BlockDeviceMappings by its VolumeSize and VolumeType (the AMI's own root, without one, is not
    counted), its public address; None for a volume of a type or region the file has no price for."""
    per_gb_month = prices["usd_per_gb_month"].get(region, {})
    volumes = 0.0
    for mapping in node_config.get("BlockDeviceMappings", []):
        ebs = mapping.get("Ebs") or {}
        price = per_gb_month.get(ebs.get("VolumeType", "gp2"))  # EC2's default type
        if price is None or "VolumeSize" not in ebs:
            return None
        volumes += ebs["VolumeSize"] * price / prices["hours_per_month"]
    return volumes, prices["usd_per_public_ipv4_hour"]
