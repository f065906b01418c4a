"""The step-time section compares only distributed tag_tf rows with the distributed peers; a plan that
kept one device is named and compared with the plain one-device run."""
from benchmarks import step_time


def _row(ms: float, **kw) -> dict:
    return {"median_ms": ms, "min_ms": ms, "max_ms": ms, "first_step_s": 0.1, "first_loss": 2.0, "last_loss": 1.9, **kw}


def _data(auto: dict) -> dict:
    return {"batch": 32, "steps": 30, "warmup": 5, "repeats": 3, "cores": 2, "machine": "x86_64",
            "rows": {"mlp/tf1-single": _row(0.2), "mlp/mirrored-local2": _row(0.8),
                     "mlp/tag-horovod-local2": _row(0.6), "mlp/tag-auto-local2": auto}}


def test_a_one_device_auto_row_is_not_compared_with_mirrored_strategy():
    text = step_time.render(_data(_row(0.21, devices=1)))
    assert "horovod 0.6 / mirrored-local2 0.8 ms = 0.75x" in text            # the distributed row, not auto's 0.21
    assert "mlp auto-local2 (0.2 ms): its plan kept one device; against the plain one-device run 0.2 ms = 1.05x" in text


def test_an_auto_row_that_spread_is_compared_and_an_unrecorded_one_is_left_out():
    assert "auto 0.4 / mirrored-local2 0.8 ms = 0.50x" in step_time.render(_data(_row(0.4, devices=2)))
    text = step_time.render(_data(_row(0.4)))
    assert "horovod 0.6 / mirrored-local2" in text and "did not record how many devices" in text
