"""Tests of helpers.seeds: one call makes Python's, NumPy's and torch's random numbers repeat."""

import random

import numpy as np
import torch

from helpers import seeds


def draws():
    return (random.random(), random.randint(0, 10**9), np.random.rand(3).tolist(), np.random.randint(0, 10**9),
            torch.rand(3).tolist(), torch.randint(0, 10**9, (1,)).item(), torch.nn.Linear(4, 2).weight.tolist())


def test_set_seed_makes_every_generator_repeat():
    seeds.set_seed(123)
    first = draws()
    draws()  # the generators moved on
    seeds.set_seed(123)
    assert draws() == first


def test_each_generator_is_seeded_not_just_one():
    seeds.set_seed(5)
    a = draws()
    seeds.set_seed(6)
    b = draws()
    assert all(x != y for x, y in zip(a, b))  # Python's, NumPy's and torch's draws all change with the seed


def test_seeds_beyond_numpys_range_work():
    seeds.set_seed(2**32 + 7)  # NumPy takes the seed modulo 2**32; torch and Python the whole number
    big = (np.random.rand(), torch.rand(1).item(), random.random())
    seeds.set_seed(7)
    small = (np.random.rand(), torch.rand(1).item(), random.random())
    assert big[0] == small[0] and big[1:] != small[1:]
