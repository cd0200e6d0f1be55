"""DAPPLE/PipeDream profiles: parsing, per-sample scaling, DAG cuts, and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.input.profiles import ProfileError, load_profile, parse_profile
from sim.input.scenario import DATA_DIR

PROFILES = DATA_DIR / "profiles" / "dapple-v100"

# Profiles shipped with the package and the batch size they were measured at.
SHIPPED = {
    "amoeba-18-pbs-8.txt": 8, "amoeba-36-pbs-1.txt": 1, "bert-24-pbs-6.txt": 6, "bert-48-pbs-2.txt": 2,
    "gnmt-16-pbs-64.txt": 64, "gnmt-32-pbs-64.txt": 64, "vgg-19-pbs-32.txt": 32, "vgg16.txt": 64,
    "xlnet-24-pbs-1.txt": 1, "xlnet-36-pbs-1.txt": 1,
}


def test_licence_and_provenance_ship_with_the_profiles():
    assert "Modified BSD License" in (PROFILES / "LICENSE").read_text()
    assert "AlibabaPAI/DAPPLE" in (PROFILES / "README.md").read_text()


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_profile_loads(name):
    text = (PROFILES / name).read_text()
    model = load_profile(PROFILES / name, profile_batch_size=SHIPPED[name])
    assert model.num_layers == sum(1 for line in text.splitlines() if line.startswith("node"))
    assert model.boundary_bytes[-1] == 0
    assert all(layer.fwd_s >= 0 and layer.bwd_s >= 0 for layer in model.layers)


def test_bert48_per_sample_values():
    model = load_profile(PROFILES / "bert-48-pbs-2.txt", profile_batch_size=2)
    assert model.num_layers == 53
    block = model.layers[4]  # node5, layer_0
    assert block.name == "layer_0"
    assert block.fwd_s == pytest.approx(2.69e-3 / 2)
    assert block.bwd_s == pytest.approx(4.47e-3 / 2)
    assert block.output_bytes == pytest.approx(4325376 / 2)
    assert block.param_bytes == 50384896


def test_bert48_cut_carries_the_attention_mask():
    # node2 (attention_mask, 3538944 B per batch of 2) feeds every transformer layer, so a cut
    # between two transformer layers carries the hidden state and the mask.
    model = load_profile(PROFILES / "bert-48-pbs-2.txt", profile_batch_size=2)
    assert model.boundary_bytes[27] == pytest.approx((4325376 + 3538944) / 2)


def test_multi_output_nodes_are_summed():
    text = (
        "node1 -- in -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=8, parameter_size=0\n"
        "node2 -- cell -- forward_compute_time=2.0, backward_compute_time=4.0, activation_size=[10; 30], parameter_size=5\n"
        "node3 -- out -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=0, parameter_size=0\n"
        "\tnode1 -- node2\n\tnode2 -- node3\n\tnode1 -- node3\n"
    )
    model = parse_profile(text, profile_batch_size=2)
    assert model.layers[1].output_bytes == pytest.approx(20.0)
    # cut before node3 carries node2's outputs and node1's output (node1 also feeds node3)
    assert model.boundary_bytes[2] == pytest.approx((40 + 8) / 2)
    assert model.boundary_bytes[0] == pytest.approx(8 / 2)


def test_out_of_order_file_is_sorted_topologically():
    text = (
        "node3 -- c -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
        "node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
        "node2 -- b -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
        "\tnode2 -- node3\n\tnode1 -- node2\n"
    )
    assert [layer.name for layer in parse_profile(text, profile_batch_size=1).layers] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no node lines"),
        ("hello world\n", ":1: cannot read"),
        ("node1 -- a -- forward_compute_time=x, backward_compute_time=1, activation_size=1, parameter_size=0\n",
         "forward_compute_time 'x' is not a number"),
        ("node1 -- a -- forward_compute_time=-1, backward_compute_time=1, activation_size=1, parameter_size=0\n",
         "must be a finite number >= 0"),
        ("node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
         "\tnode1 -- node9\n", "names node9"),
        ("node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
         "node2 -- b -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
         "\tnode1 -- node2\n\tnode2 -- node1\n", "cycle"),
    ],
)
def test_malformed_profiles(text, message):
    with pytest.raises(ProfileError, match=message):
        parse_profile(text, profile_batch_size=1)


def test_unreadable_file(tmp_path: Path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "missing.txt", profile_batch_size=1)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(binary, profile_batch_size=1)


def test_optional_stash_size_replaces_the_output_as_stash():
    text = (
        "node1 -- a -- forward_compute_time=1, backward_compute_time=2, activation_size=40, parameter_size=8, "
        "stash_size=100\n"
        "node2 -- b -- forward_compute_time=1, backward_compute_time=2, activation_size=40, parameter_size=8\n"
        "\tnode1 -- node2\n"
    )
    model = parse_profile(text, profile_batch_size=4)
    assert model.layers[0].stash_bytes == pytest.approx(25.0)
    assert model.layers[1].stash_bytes == pytest.approx(10.0)  # no stash_size: the output, as before
    with pytest.raises(ProfileError, match="stash_size 'x' is not a number"):
        parse_profile(text.replace("stash_size=100", "stash_size=x"), profile_batch_size=4)
