"""The built-in arithmetic task: determinism, graded difficulty, exact answers, disjoint splits."""

from __future__ import annotations

import ast
import operator

import pytest

from hacrl_core.data.arithmetic import ArithmeticTask, evaluate, split_of, worked_solution

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _reference_value(expression: str) -> int:
    """Independent evaluation of a generated expression through Python's own parser (no eval)."""

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # negative steps of a worked chain
            return -walk(node.operand)
        raise AssertionError(f"unexpected node {ast.dump(node)}")

    return walk(ast.parse(expression, mode="eval").body)


@pytest.mark.parametrize(
    ("operands", "operators", "value"),
    [
        ([3, 4, 2], ["+", "*"], 11),
        ([3, 4, 2], ["*", "-"], 10),
        ([9, 9, 9], ["-", "-"], -9),
        ([2, 3, 4, 5], ["*", "+", "*"], 26),
        ([7], [], 7),
    ],
)
def test_evaluate_golden(operands: list[int], operators: list[str], value: int) -> None:
    assert evaluate(operands, operators) == value


def test_answers_match_an_independent_evaluation() -> None:
    for split in ("train", "eval"):
        task = ArithmeticTask(difficulty=(1, 5), seed=3, split=split, size=500)
        for problem in task:
            expression = problem.question.removesuffix("=")
            assert problem.answer == str(_reference_value(expression)), problem


def test_same_seed_same_problems_and_uids() -> None:
    first = [ArithmeticTask(seed=7).problem(i) for i in range(50)]
    second = [ArithmeticTask(seed=7).problem(i) for i in range(50)]
    other = [ArithmeticTask(seed=8).problem(i) for i in range(50)]
    assert first == second
    assert [p.question for p in first] != [p.question for p in other]
    assert len({p.uid for p in first}) == 50
    assert first[0].uid == "arith-s7-d1-3-train-0"


def test_difficulty_is_the_number_of_operations_and_covers_the_range() -> None:
    task = ArithmeticTask(difficulty=(2, 4), seed=0, size=300)
    seen = set()
    for problem in task:
        operations = sum(problem.question.count(op) for op in "+-*")
        assert operations == problem.difficulty
        seen.add(problem.difficulty)
    assert seen == {2, 3, 4}
    assert {p.difficulty for p in ArithmeticTask(difficulty=2, size=20)} == {2}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_train_and_eval_splits_are_disjoint(seed: int) -> None:
    train = {p.question for p in ArithmeticTask(difficulty=(1, 2), seed=seed, split="train", size=3000)}
    held_out = {p.question for p in ArithmeticTask(difficulty=(1, 2), seed=seed + 10, split="eval", size=1000)}
    assert train.isdisjoint(held_out)
    assert all(split_of(q.removesuffix("=")) == "eval" for q in held_out)


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="difficulty"):
        ArithmeticTask(difficulty=(0, 2))
    with pytest.raises(ValueError, match="split must be one of train, eval"):
        ArithmeticTask(split="test")
    with pytest.raises(IndexError):
        ArithmeticTask(size=3)[3]


@pytest.mark.parametrize(
    ("operands", "operators", "solution"),
    [
        ([3, 4, 2, 5], ["+", "*", "-"], "4*2=8; 3+8=11; 11-5=6 #### 6"),
        ([3, 4], ["+"], "3+4=7 #### 7"),
        ([2, 3, 4], ["*", "*"], "2*3=6; 6*4=24 #### 24"),
        ([9, 9, 9], ["-", "-"], "9-9=0; 0-9=-9 #### -9"),
    ],
)
def test_worked_solution_golden(operands: list[int], operators: list[str], solution: str) -> None:
    assert worked_solution(operands, operators) == solution


def test_chain_solutions_are_correct_step_by_step_and_end_in_the_gold() -> None:
    from hacrl_core.rewards import get_reward

    task = ArithmeticTask(difficulty=(1, 5), seed=4, size=300, format="chain")
    plain = ArithmeticTask(difficulty=(1, 5), seed=4, size=300)
    for problem, same in zip(task, plain, strict=True):
        assert (problem.uid, problem.question, problem.answer) == (
            same.uid,
            same.question,
            same.answer,
        )  # format changes no problem
        steps, _, final = problem.solution.partition(" #### ")
        assert final == problem.answer and len(steps.split("; ")) == problem.difficulty
        for step in steps.split("; "):
            left, right = step.split("=")
            assert _reference_value(left) == int(right), (problem.question, step)
        assert get_reward("exact")(problem.solution, problem.answer) == 1.0
        assert (
            get_reward("exact")(problem.solution.replace(f"#### {final}", f"#### {int(final) + 1}"), problem.answer)
            == 0.0
        )
    assert plain[0].solution == plain[0].answer
    assert "&format=chain" in task.name and "format" not in plain.name
    with pytest.raises(ValueError, match="format must be one of answer, chain"):
        ArithmeticTask(format="essay")
