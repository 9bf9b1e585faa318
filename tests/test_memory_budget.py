"""The memory budget the FFN commands and the report check volumes against: where it comes from, in that order
(``--memory-gb``, ``$HPCTRAIN_MEMORY_GB``, half of what this process may use), and what a refusal says."""

from __future__ import annotations

import argparse

import pytest

from hpctrain.errors import ConfigError, DataError
from hpctrain.memory_budget import (
    ENV_VAR,
    MACHINE_SHARE,
    MemoryBudget,
    array_bytes,
    gb_flag,
    memory_budget,
    usable_memory,
)


def test_the_flag_comes_before_the_environment_and_the_environment_before_the_machine() -> None:
    assert memory_budget(2.5, {ENV_VAR: "7"}) == MemoryBudget(2_500_000_000, "--memory-gb 2.5")
    assert memory_budget(None, {ENV_VAR: " 7 "}) == MemoryBudget(7_000_000_000, f"{ENV_VAR}=7")
    usable, said = usable_memory()
    machine = memory_budget(None, {})
    assert usable > 0 and machine.limit == int(usable * MACHINE_SHARE) and said in machine.source


@pytest.mark.parametrize("text", ["lots", "0", "-3", "nan", "inf", "1e999", "2e6"])
def test_a_budget_that_is_not_a_number_of_gb_is_one_error_naming_where_it_was(text: str) -> None:
    with pytest.raises(ConfigError, match=ENV_VAR):
        memory_budget(None, {ENV_VAR: text})
    with pytest.raises(argparse.ArgumentTypeError):
        gb_flag(text)


def test_a_refusal_names_the_need_the_budget_and_its_source() -> None:
    budget = MemoryBudget(10**9, "--memory-gb 1")
    budget.check(10**9, "reading x")  # exactly the budget fits
    with pytest.raises(DataError) as refused:
        budget.check(10**9 + 1, "reading x (3, 4) uint8")
    assert str(refused.value).startswith("reading x (3, 4) uint8 needs 1 GB of memory, more than the budget of 1 GB "
                                         "(--memory-gb 1) (give a larger budget")


def test_array_bytes_of_a_declared_shape_overflow_nothing() -> None:
    assert array_bytes((1 << 40,) * 3, 8) == 1 << 123
    assert array_bytes((0, 1 << 60), 8) == 0
