"""judge_cases: tests files and task.yml cases, and the seeds a runner's POPCORN_SEED gives them."""
import pytest

import judge_cases


def test_a_tests_file_is_read_line_by_line(tmp_path):
    path = tmp_path / "cases.txt"
    path.write_text("batchsize: 4; qseqlen: 1; kvseqlen: 1024; seed: 7\n\nbatch: 2; ragged: true; seed: -3\n")
    assert judge_cases.parse_tests_file(str(path)) == [
        {"batchsize": 4, "qseqlen": 1, "kvseqlen": 1024, "seed": 7}, {"batch": 2, "ragged": True, "seed": -3}]


@pytest.mark.parametrize("text,needle", [("batchsize 4; seed: 1\n", ":1: invalid case part"),
                                         ("seed: 1.5\n", "invalid case part"), ("\n\n", "holds no cases")])
def test_a_malformed_tests_file_names_its_line(tmp_path, text, needle):
    path = tmp_path / "cases.txt"
    path.write_text(text)
    with pytest.raises(judge_cases.DefinitionError, match=needle):
        judge_cases.parse_tests_file(str(path))


def test_cases_bind_to_generate_input_and_need_a_seed():
    def generate_input(batch: int, seed: int):
        return batch, seed
    judge_cases.validate_cases([{"batch": 2, "seed": 1}], generate_input, "here")
    with pytest.raises(judge_cases.DefinitionError, match="case 0 .*takes \\['batch', 'seed'\\]"):
        judge_cases.validate_cases([{"batches": 2, "seed": 1}], generate_input, "here")
    with pytest.raises(judge_cases.DefinitionError, match="integer `seed`"):
        judge_cases.validate_cases([{"batch": 2, "seed": True}], generate_input, "here")


def test_a_runners_seed_changes_every_case_seed_and_keeps_the_spec():
    cases = judge_cases.make_cases([{"batch": 2, "seed": 5}], seed=1234)
    assert cases[0].spec == "batch: 2; seed: 5"
    assert cases[0].args["seed"] == judge_cases.combine_seeds(5, 1234) != 5
    assert judge_cases.make_cases([{"batch": 2, "seed": 5}], seed=None)[0].args["seed"] == 5
