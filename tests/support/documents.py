"""Editing nested YAML documents in tests by a dotted path (`spec.agents.0.name`)."""

DELETE = object()  # pass as the value to remove the key


def set_path(document: dict, path: str, value):
    """Set (or with DELETE remove) the value at ``path``; digits index lists; missing maps are created."""
    node = document
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    last = keys[-1]
    if value is DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return document
