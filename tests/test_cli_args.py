"""Every numeric option of every subcommand is checked as the command line is read: a bad value is refused
with one sentence naming the option, what it accepts and the value given, and nothing is loaded."""

import pytest

from redline.app import cli, cli_bench, cli_chat, cli_estimate

REFUSED = [
    (["chat", "--temperature", "-1"], "--temperature must be 0 or more (0 is greedy), not -1"),
    (["chat", "--temperature", "warm"], "--temperature must be 0 or more (0 is greedy), not warm"),
    (["chat", "--context", "0"], "--context must be a whole number, 1 or more, not 0"),
    (["chat", "--max-new-tokens", "-5"], "--max-new-tokens must be a whole number, 1 or more, not -5"),
    (["chat", "--max-new-tokens", "2.5"], "--max-new-tokens must be a whole number, 1 or more, not 2.5"),
    (["chat", "--top-p", "1.5"], "--top-p must be more than 0 and at most 1, not 1.5"),
    (["chat", "--top-p", "0"], "--top-p must be more than 0 and at most 1, not 0"),
    (["chat", "--top-k", "-1"], "--top-k must be a whole number, 0 or more (0 turns it off), not -1"),
    (["chat", "--repetition-penalty", "0"], "--repetition-penalty must be more than 0 (1 changes nothing), not 0"),
    (["chat", "--seed", "-3"], "--seed must be a whole number from 0 to 18446744073709551615, not -3"),
    (["chat", "--num-draft-tokens", "0"], "--num-draft-tokens must be a whole number, 1 or more, not 0"),
    (["chat", "--lookup-tokens", "0"], "--lookup-tokens must be a whole number, 1 or more, not 0"),
    (["bench", "--new-tokens", "0"], "--new-tokens must be a whole number, 1 or more, not 0"),
    (["bench", "--warmup", "-1"], "--warmup must be a whole number, 0 or more, not -1"),
    (["bench", "--samples", "0"], "--samples must be a whole number, 1 or more, not 0"),
    (["bench", "--max-prompts", "0"], "--max-prompts must be a whole number, 1 or more, not 0"),
    (["bench", "--prompt-tokens", "0"], "--prompt-tokens must be a whole number, 1 or more, not 0"),
    (["bench", "--temperature", "-0.5"], "--temperature must be 0 or more (0 is greedy), not -0.5"),
    (["bench", "--seed", "x"], "--seed must be a whole number from 0 to 18446744073709551615, not x"),
    (
        ["bench", "--batch-sweep", "1,0,4"],
        "--batch-sweep must be whole numbers, each 1 or more, separated by commas (e.g. 1,2,4,8), not 1,0,4",
    ),
    (["estimate", "starter", "--context", "0"], "--context must be a whole number, 1 or more, not 0"),
    (["estimate", "starter", "--batch", "0"], "--batch must be a whole number, 1 or more, not 0"),
    (["estimate", "starter", "--free-gb", "-2"], "--free-gb must be more than 0, not -2"),
    (["estimate", "starter", "--free-gb", "inf"], "--free-gb must be more than 0, not inf"),
]


@pytest.fixture
def nothing_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("loaded something before the arguments were checked")

    monkeypatch.setattr(cli_chat, "EngineService", refuse)
    monkeypatch.setattr(cli_bench, "EngineService", refuse)
    monkeypatch.setattr(cli_estimate, "read_shape", refuse)


@pytest.mark.parametrize("argv, sentence", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_bad_numbers_are_refused_before_anything_loads(argv, sentence, capsys, nothing_loads):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"redline {argv[0]}: error: {sentence}"


def test_edge_values_are_accepted_and_converted():
    args = cli.build_parser().parse_args(
        ["chat", "--temperature", "0", "--top-p", "1", "--top-k", "0", "--seed", "0", "--context", "1"]
    )
    assert (args.temperature, args.top_p, args.top_k, args.seed, args.context) == (0.0, 1.0, 0, 0, 1)
    bench = cli.build_parser().parse_args(["bench", "--warmup", "0", "--batch-sweep", "1, 2,8"])
    assert bench.warmup == 0 and bench.batch_sweep == [1, 2, 8]
    defaults = cli.build_parser().parse_args(["chat"])
    assert (defaults.max_new_tokens, defaults.temperature, defaults.num_draft_tokens) == (256, None, 5)


def test_speculative_without_a_draft_is_refused_before_the_model_loads(capsys, nothing_loads):
    assert cli.main(["chat", "hello", "--strategy", "speculative"]) == 2
    assert capsys.readouterr().err == (
        "error: --strategy speculative needs --draft. Pass a small model of the same family, e.g. --draft starter.\n"
    )


@pytest.mark.parametrize("flag", ["--textbook-protocol", "--seed-preset"])
def test_the_textbook_protocol_sets_its_counts_and_says_what_they_are(flag, capsys):
    from redline.inference import SEED_PRESET

    spec = cli_bench.spec_from_args(cli.build_parser().parse_args(["bench", flag]))
    assert (spec.warmup, spec.samples) == (SEED_PRESET["warmup"], SEED_PRESET["samples"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        f"--textbook-protocol, --seed-preset the textbook protocol: {SEED_PRESET['warmup']} warm-up runs" in help_text
    )
