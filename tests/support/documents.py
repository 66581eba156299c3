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


#: The smallest valid experiment: two tiny agents on the built-in task, every default.
MINIMAL = {
    "apiVersion": "hacrl.io/v1alpha1",
    "kind": "HACRLExperiment",
    "metadata": {"name": "demo"},
    "spec": {
        "agents": [{"name": "small", "model": "tiny://llama-char"}, {"name": "big", "model": "tiny://qwen2-bpe"}],
        "data": {"train": {"source": "builtin://arithmetic"}},
    },
}
