def test_mock_model_end_to_end(run):
    result = run([{"prompt": "say hi"}, {"prompt": "list files"}, {"prompt": "write notes"}], "--num_workers=2")
    assert result.code == 0, result.stderr
    assert len(result.trajectories) == 3
