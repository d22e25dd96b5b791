"""result.json v1/v2 validation (worker_agent/results.py: shared by the server and the worker): pure tests, no database.

Each malformed case asserts the error code and that the message names what is wrong (the path, key,
index or line) and what to do about it; the valid examples assert the exact parsed shapes."""
from __future__ import annotations

import copy
import hashlib
import json
import mimetypes
from dataclasses import dataclass, field

import pytest

from worker_agent.core.outputs import walk_outputs
from worker_agent.results import (
    MAX_DATASET_DIRECTORY_FILES,
    SERVER_LIMIT_SETTING,
    OutputFile,
    ResultError,
    ValidatedResult,
    decode_manifest,
    parse_result_json,
    validate_result,
)


def sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def output(path: str, content: bytes = b"", kind: str = "file") -> OutputFile:
    if kind != "file":
        return OutputFile(path=path, size=0, sha256="", kind=kind)
    return OutputFile(path=path, size=len(content), sha256=sha(content))


def declared(path: str, content: bytes, **extra) -> dict:
    return {"path": path, "sha256": sha(content), "size": len(content), **extra}


WEIGHTS = b"\x00\x01weights" * 64
LOG = b"epoch 1 loss 0.5\n"
AUDIO = {"prepared/a.wav": b"RIFF-a", "prepared/b.wav": b"RIFF-bb", "prepared/sub/c.wav": b"RIFF-ccc"}


def manifest_lines(entries: dict[str, bytes]) -> str:
    return "".join(json.dumps(declared(path, content)) + "\n" for path, content in entries.items())


@dataclass
class Scenario:
    """A valid version 2 result and its outputs directory; each case breaks one thing."""

    result: dict = field(default_factory=lambda: {
        "version": 2,
        "complete": True,
        "artifacts": [declared("model/weights.bin", WEIGHTS), declared("logs/train.txt", LOG)],
        "metrics": [{"name": "train.loss", "value": 0.12, "step": 100}],
        "artifactsManifest": "artifacts.jsonl",
        "models": [{"path": "model/weights.bin"}],
        "datasets": [{"datasetId": "ds-audio", "path": "prepared"}],
    })
    contents: dict = field(default_factory=lambda: {
        "model/weights.bin": WEIGHTS, "logs/train.txt": LOG, **AUDIO,
    })
    extra_files: list = field(default_factory=list)
    manifest: str | None = field(default_factory=lambda: manifest_lines(AUDIO))
    manifest_hash: str | None = None  # the sha256 the worker reports for the manifest; None = of `manifest`
    manifest_listed: bool = True  # whether the manifest file appears in the outputs file list
    send_manifest_text: bool = True  # whether the caller passes the manifest's text
    max_files: int = 10_000

    def files(self) -> list[OutputFile]:
        files = [output(path, content) for path, content in self.contents.items()]
        files.append(output("result.json", json.dumps(self.result).encode()))
        if self.manifest is not None and self.manifest_listed and "artifactsManifest" in self.result:
            text = str(self.manifest).encode()
            reported = self.manifest_hash if self.manifest_hash is not None else sha(text)
            files.append(OutputFile(self.result["artifactsManifest"], len(text), reported))
        return files + self.extra_files

    def run(self) -> ValidatedResult:
        text = self.manifest if self.send_manifest_text else None
        return validate_result(self.result, self.files(), manifest_text=text, max_files=self.max_files)


def v1(s: Scenario) -> None:
    s.result = {"version": 1, "complete": True, "artifacts": s.result["artifacts"], "metrics": s.result["metrics"]}
    s.contents = {"model/weights.bin": WEIGHTS, "logs/train.txt": LOG}
    s.manifest = None


def rename_artifact(new_path: str):
    def change(s: Scenario) -> None:
        s.result["artifacts"][1]["path"] = new_path
    return change


def metric(**fields):
    def change(s: Scenario) -> None:
        s.result["metrics"] = [{"name": "train.loss", "value": 0.5, "step": 1, **fields}]
    return change


def set_key(*keys, value):
    """Set result[keys...] = value, creating nothing: the path must exist up to its last key."""
    def change(s: Scenario) -> None:
        target = s.result
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return change


def drop_key(*keys):
    def change(s: Scenario) -> None:
        target = s.result
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]
    return change


def many_files(s: Scenario) -> None:
    s.max_files = 4  # 2 listed + 3 in the manifest = 5 files
    s.extra_files = []


def manifest_over_limit(s: Scenario) -> None:
    s.max_files = 5  # the 5 files present fit; the manifest declares a sixth that is not there
    s.manifest += manifest_lines({"prepared/d.wav": b"d"})


def manifest_text(text: str):
    def change(s: Scenario) -> None:
        s.manifest = text
    return change


def duplicate_in_manifest(s: Scenario) -> None:
    s.manifest += json.dumps(declared("prepared/a.wav", AUDIO["prepared/a.wav"])) + "\n"


def manifest_repeats_listed_artifact(s: Scenario) -> None:
    s.manifest += json.dumps(declared("logs/train.txt", LOG)) + "\n"


def long_manifest_line(s: Scenario) -> None:
    path = "prepared/" + "n" * 4100 + ".wav"
    s.manifest = manifest_lines({"prepared/a.wav": AUDIO["prepared/a.wav"]}) + json.dumps(declared(path, b"z")) + "\n"


def manifest_missing_from_outputs(s: Scenario) -> None:
    s.result["artifactsManifest"] = "lists/artifacts.jsonl"
    s.manifest_listed = False


def manifest_changed(s: Scenario) -> None:
    s.manifest_hash = sha(b"the file as it was on disk")


def no_manifest_text(s: Scenario) -> None:
    s.send_manifest_text = False


def extra_output(path: str, kind: str = "file", content: bytes = b"stray"):
    def change(s: Scenario) -> None:
        s.extra_files.append(output(path, content, kind))
    return change


def missing_output(s: Scenario) -> None:
    del s.contents["logs/train.txt"]


def changed_content(content: bytes):
    def change(s: Scenario) -> None:
        s.contents["logs/train.txt"] = content
    return change


def unhashed_listing(s: Scenario) -> None:
    s.extra_files.append(OutputFile("notes.txt", 5, ""))


def sizeless_listing(s: Scenario) -> None:
    s.extra_files.append(OutputFile("notes.txt", "5", sha(b"notes")))  # type: ignore[arg-type]


def manifest_sent_as_number(s: Scenario) -> None:
    s.manifest = 12  # type: ignore[assignment]
    s.manifest_hash = sha(b"12")


def duplicate_listing(s: Scenario) -> None:
    s.extra_files.append(output("logs/train.txt", LOG))


def models(count: int):
    def change(s: Scenario) -> None:
        s.result["models"] = [{"path": "model/weights.bin"} for _ in range(count)]
    return change


def datasets(count: int):
    def change(s: Scenario) -> None:
        s.result["datasets"] = [{"datasetId": f"ds-{i}", "path": "prepared"} for i in range(count)]
    return change


def dataset(**fields):
    def change(s: Scenario) -> None:
        s.result["datasets"] = [{"datasetId": "ds-audio", **fields}]
    return change


def sixteen_models(s: Scenario) -> None:
    checkpoints = {f"model/ckpt-{i}.bin": bytes([i]) * 8 for i in range(15)}
    s.contents.update(checkpoints)
    s.result["artifacts"] += [declared(path, content) for path, content in checkpoints.items()]
    s.result["models"] = [{"path": "model/weights.bin"}] + [{"path": path} for path in checkpoints]


def metric_points(count: int):
    def change(s: Scenario) -> None:
        s.result["metrics"] = [{"name": "loss", "value": 1.0, "step": i} for i in range(count)]
    return change


SIXTY_FOUR_A = "a" * 64

# (change, code, fragments the message must contain)
MALFORMED = [
    pytest.param(rename_artifact("../x"), "path_traversal", ['"../x"', '".."', "artifacts[1]"],
                 id="a path that climbs out with .. is refused"),
    pytest.param(rename_artifact("logs/../../etc/passwd"), "path_traversal", ["logs/../../etc/passwd", "remove"],
                 id="a .. hidden in the middle of a path is refused"),
    pytest.param(rename_artifact("/etc/passwd"), "absolute_path", ['"/etc/passwd"', "relative"],
                 id="an absolute path is refused"),
    pytest.param(rename_artifact("logs\\train.txt"), "backslash_in_path", ["backslash", '"/"'],
                 id="a backslash in a path is refused"),
    pytest.param(rename_artifact("logs/tr\x00ain.txt"), "control_character", ["NUL", "\\u0000", "rename"],
                 id="a NUL in a path is refused"),
    pytest.param(rename_artifact("logs/tr\rain.txt"), "control_character", ["carriage return", "\\r"],
                 id="a carriage return in a path is refused"),
    pytest.param(rename_artifact("logs/tr\nain.txt"), "control_character", ["line feed", "\\n"],
                 id="a line feed in a path is refused"),
    pytest.param(rename_artifact("x/" + "y" * 1023), "path_too_long", ["1025 characters", "at most 1024"],
                 id="a path over 1024 characters is refused"),
    pytest.param(rename_artifact(""), "invalid_path", ["artifacts[1] path is empty"],
                 id="an empty path is refused"),
    pytest.param(rename_artifact("logs//train.txt"), "invalid_path", ['"logs//train.txt"', '"//"'],
                 id="a path with an empty component is refused"),
    pytest.param(rename_artifact("./logs/train.txt"), "invalid_path", ['"./logs/train.txt"', "one spelling"],
                 id="a path with a dot component is refused"),
    pytest.param(rename_artifact(7), "invalid_type", ["artifacts[1] path is a number", "string"],
                 id="a path that is not a string is refused"),
    pytest.param(rename_artifact("logs/train.txt.partial"), "temporary_file", ["train.txt.partial", "finish writing"],
                 id="a declared .partial file is refused"),
    pytest.param(extra_output("checkpoints/step-10.tmp"), "temporary_file", ['"checkpoints/step-10.tmp"', "unfinished"],
                 id="a .tmp file left in the outputs is refused"),
    pytest.param(extra_output("latest", kind="symlink"), "symlink", ['"latest"', "symbolic link", "copy the real file"],
                 id="a symlink in the outputs is refused"),
    pytest.param(extra_output("queue", kind="special"), "special_file", ['"queue"', "regular file"],
                 id="a fifo or device in the outputs is refused"),
    pytest.param(extra_output("notes/extra.txt"), "undeclared_file", ['"notes/extra.txt"', "declare every output"],
                 id="a file present but not declared is refused"),
    pytest.param(missing_output, "missing_file", ["artifacts[1]", '"logs/train.txt"', "not in the outputs directory"],
                 id="a declared file that is missing is refused"),
    pytest.param(changed_content(b"epoch 1 loss 0.7\n"), "sha256_mismatch", ['"logs/train.txt"', "sha256", "recompute"],
                 id="a sha256 that does not match the file is refused"),
    pytest.param(changed_content(LOG + b"more"), "size_mismatch", ['"logs/train.txt"', f"size {len(LOG)}", "bytes"],
                 id="a size that does not match the file is refused"),
    pytest.param(set_key("artifacts", 0, "sha256", value="xyz"), "invalid_sha256",
                 ['artifacts[0] sha256 "xyz"', "64 hex digits"], id="a sha256 that is not hex is refused"),
    pytest.param(set_key("artifacts", 0, "size", value=-1), "invalid_size", ["artifacts[0] size -1", "whole number"],
                 id="a negative size is refused"),
    pytest.param(set_key("artifacts", 0, "size", value=12.0), "invalid_size", ["size 12.0", "without a decimal point"],
                 id="a size written as a decimal is refused"),
    pytest.param(set_key("artifacts", 0, "size", value=True), "invalid_size", ["size true"],
                 id="a size written as a boolean is refused"),
    pytest.param(set_key("artifacts", 0, "mimeType", value="not a type"), "invalid_mime_type",
                 ['mimeType "not a type"', "application/octet-stream"], id="a malformed mimeType is refused"),
    pytest.param(set_key("artifacts", 1, value=declared("model/weights.bin", WEIGHTS)), "duplicate_path",
                 ["artifacts[1]", '"model/weights.bin"', "declared once"],
                 id="the same artifact path twice is refused"),
    pytest.param(set_key("artifacts", 1, value=declared("result.json", b"{}")), "reserved_path",
                 ['"result.json"', "remove this entry"], id="declaring result.json as an artifact is refused"),
    pytest.param(set_key("artifacts", 1, value=declared("artifacts.jsonl", b"")), "reserved_path",
                 ['"artifacts.jsonl"', "artifactsManifest"], id="declaring the manifest as an artifact is refused"),
    pytest.param(set_key("artifacts", value={"path": "a"}), "invalid_type", ['"artifacts" is an object', "list"],
                 id="artifacts that is not a list is refused"),
    pytest.param(set_key("artifacts", 0, value="model/weights.bin"), "invalid_type", ["artifacts[0] is a string"],
                 id="an artifact that is not an object is refused"),
    pytest.param(drop_key("artifacts", 0, "sha256"), "missing_key", ['artifacts[0] has no "sha256"', "64 hex"],
                 id="an artifact without sha256 is refused"),
    pytest.param(many_files, "too_many_files", ["5 files", "limit is 4", "MMT_WORKER_MAX_OUTPUT_FILES"],
                 id="more files than max_files is refused"),
    pytest.param(manifest_over_limit, "too_many_files",
                 ["limit of 5 files", '"artifacts.jsonl" line 4', "write fewer output files"],
                 id="a manifest declaring more than max_files is refused"),
    pytest.param(set_key("checksum", value="abc"), "unknown_key", ['"checksum"', "remove it"],
                 id="an unknown top-level key is refused"),
    pytest.param(set_key("artifacts", 0, "md5", value="abc"), "unknown_key", ["artifacts[0]", '"md5"', "path, sha256"],
                 id="an unknown key in an artifact is refused"),
    pytest.param(metric(unit="s"), "unknown_key", ["metrics[0]", '"unit"'],
                 id="an unknown key in a metric is refused"),
    pytest.param(set_key("models", 0, "format", value="onnx"), "unknown_key", ["models[0]", '"format"'],
                 id="an unknown key in a model is refused"),
    pytest.param(set_key("datasets", 0, "split", value="test"), "unknown_key", ["datasets[0]", '"split"'],
                 id="an unknown key in a dataset is refused"),
    pytest.param(lambda s: (v1(s), s.result.update(models=[])), "unknown_key", ['"models"', "version 2"],
                 id="a version 1 result with models is refused"),
    pytest.param(set_key("complete", value=False), "not_complete", ['"complete" is false', "true"],
                 id="complete false is refused"),
    pytest.param(set_key("complete", value="true"), "not_complete", ['"complete" is "true"'],
                 id="complete written as a string is refused"),
    pytest.param(drop_key("complete"), "missing_key", ['no "complete"', '"complete": true'],
                 id="a result without complete is refused"),
    pytest.param(set_key("version", value=3), "unsupported_version", ['"version" is 3', "1 or 2"],
                 id="version 3 is refused"),
    pytest.param(set_key("version", value="2"), "unsupported_version", ['"version" is "2"', "integer"],
                 id="version written as a string is refused"),
    pytest.param(drop_key("version"), "missing_key", ['no "version"'], id="a result without version is refused"),
    pytest.param(metric(value="NaN"), "non_finite_metric", ["metrics[0]", '"NaN"', '"train.loss"', "finite"],
                 id="a metric value NaN written as a string is refused"),
    pytest.param(metric(value="inf"), "non_finite_metric", ['"inf"'], id="a metric value inf as a string is refused"),
    pytest.param(metric(value="-Infinity"), "non_finite_metric", ['"-Infinity"'],
                 id="a metric value -Infinity as a string is refused"),
    pytest.param(metric(value=float("nan")), "non_finite_metric", ["metrics[0]", "not finite"],
                 id="a metric value that is a NaN float is refused"),
    pytest.param(metric(value=float("-inf")), "non_finite_metric", ["metrics[0]"],
                 id="a metric value that is negative infinity is refused"),
    pytest.param(metric(value=10**400), "non_finite_metric", ["metrics[0]"],
                 id="a metric value too large for a float is refused"),
    pytest.param(metric(value="0.5"), "invalid_metric_value", ['"0.5"', "without quotes"],
                 id="a metric value written as a numeric string is refused"),
    pytest.param(metric(value=True), "invalid_metric_value", ["a boolean", "JSON number"],
                 id="a metric value that is a boolean is refused"),
    pytest.param(metric(step=-1), "invalid_step", ["metrics[0] step -1", "0 to 9007199254740991"],
                 id="a negative step is refused"),
    pytest.param(metric(step=1.5), "invalid_step", ["step 1.5", "not an integer"], id="a fractional step is refused"),
    pytest.param(metric(step=2.0), "invalid_step", ["step 2.0", "without a decimal point"],
                 id="a step written as a float is refused"),
    pytest.param(metric(step=2**53), "invalid_step", ["step 9007199254740992", "out of range"],
                 id="a step above 2^53-1 is refused"),
    pytest.param(metric(step="3"), "invalid_step", ['step "3"'], id="a step written as a string is refused"),
    pytest.param(metric(name=""), "invalid_metric_name", ["metrics[0] name", "train.loss"],
                 id="an empty metric name is refused"),
    pytest.param(metric(timestamp="2024-05-01 12:00:00"), "invalid_timestamp", ['"2024-05-01 12:00:00"', "time zone"],
                 id="a metric timestamp without a time zone is refused"),
    pytest.param(metric_points(1001), "too_many_metrics", ["1001 metric points", "limit is 1000"],
                 id="more than 1000 metric points is refused"),
    pytest.param(models(17), "too_many_models", ["17 models", "limit is 16"], id="more than 16 models is refused"),
    pytest.param(datasets(65), "too_many_datasets", ["65 datasets", "limit is 64"],
                 id="more than 64 datasets is refused"),
    pytest.param(set_key("models", 0, "path", value="model/other.bin"), "undeclared_model_path",
                 ['models[0] path "model/other.bin"', "not a declared artifact"],
                 id="a model path that is not a declared artifact is refused"),
    pytest.param(set_key("models", 0, "path", value="model"), "undeclared_model_path",
                 ['"model" is a directory', "weights file"], id="a model path naming a directory is refused"),
    pytest.param(set_key("models", 0, "path", value="../model/weights.bin"), "path_traversal", ["models[0] path"],
                 id="a model path that climbs out with .. is refused"),
    pytest.param(lambda s: s.result["models"].append({"path": "model/weights.bin"}), "duplicate_model",
                 ["models[1]", '"model/weights.bin"'], id="the same model declared twice is refused"),
    pytest.param(set_key("models", 0, "metadata", value=[1]), "invalid_type", ['models[0] "metadata" is a list'],
                 id="model metadata that is not an object is refused"),
    pytest.param(dataset(path="prepared", uri="s3://bucket/x", digest="d"), "invalid_dataset_source",
                 ["datasets[0] has both", "exactly one"], id="a dataset with both path and uri is refused"),
    pytest.param(dataset(), "invalid_dataset_source", ["datasets[0] has neither"],
                 id="a dataset with neither path nor uri is refused"),
    pytest.param(dataset(uri="s3://bucket/eval"), "missing_digest", ['"s3://bucket/eval"', '"digest"'],
                 id="a dataset uri without a digest is refused"),
    pytest.param(dataset(path="prepared", digest="sha256:abc"), "digest_not_allowed", ["datasets[0]", "remove it"],
                 id="a digest next to a dataset path is refused"),
    pytest.param(dataset(path="missing_dir"), "undeclared_dataset_path", ['"missing_dir"', "declare the files"],
                 id="a dataset path with no declared files is refused"),
    pytest.param(dataset(path="/prepared"), "absolute_path", ["datasets[0] path"],
                 id="an absolute dataset path is refused"),
    pytest.param(lambda s: s.result["datasets"].append({"datasetId": "ds-audio", "path": "prepared/"}),
                 "duplicate_dataset", ["datasets[1]", '"prepared"', '"ds-audio"'],
                 id="the same dataset version declared twice is refused"),
    pytest.param(drop_key("datasets", 0, "datasetId"), "missing_key", ['datasets[0] has no "datasetId"'],
                 id="a dataset without datasetId is refused"),
    pytest.param(set_key("datasets", 0, "datasetId", value=""), "invalid_reference", ['"datasetId"', "non-empty"],
                 id="an empty datasetId is refused"),
    pytest.param(long_manifest_line, "manifest_line_too_long", ['"artifacts.jsonl" line 2', "at most 4096 bytes"],
                 id="a manifest line over 4 KiB is refused"),
    pytest.param(manifest_text('{"path": "prepared/a.wav", "sha256": \n'), "manifest_malformed",
                 ['"artifacts.jsonl" line 1', "not valid JSON", "one JSON object per line"],
                 id="a manifest line that is not JSON is refused"),
    pytest.param(manifest_text(manifest_lines(AUDIO) + '["prepared/d.wav"]\n'), "manifest_malformed",
                 ["line 4 holds a list"], id="a manifest line that is not an object is refused"),
    pytest.param(manifest_text('{"path": "prepared/a.wav", "path": "x", "sha256": "", "size": 1}\n'), "duplicate_key",
                 ["line 1", '"path" twice'], id="a manifest line with a repeated key is refused"),
    pytest.param(manifest_text('{"path": "prepared/a.wav", "sha256": "' + SIXTY_FOUR_A + '", "size": NaN}\n'),
                 "non_finite_number", ["line 1", "NaN", "size"], id="a manifest line with a NaN literal is refused"),
    pytest.param(duplicate_in_manifest, "duplicate_path", ['"artifacts.jsonl" line 4', '"prepared/a.wav"'],
                 id="the same path twice in the manifest is refused"),
    pytest.param(manifest_repeats_listed_artifact, "duplicate_path", ["line 4", '"logs/train.txt"'],
                 id="a manifest path that repeats a listed artifact is refused"),
    pytest.param(manifest_text(manifest_lines(AUDIO).replace('"size"', '"bytes"', 1)), "unknown_key",
                 ['"artifacts.jsonl" line 1', '"bytes"'], id="a manifest line with an unknown key is refused"),
    pytest.param(manifest_text(manifest_lines(AUDIO) + json.dumps(declared("../up.wav", b"u")) + "\n"),
                 "path_traversal", ['line 4 path "../up.wav"'],
                 id="a manifest line whose path climbs out with .. is refused"),
    pytest.param(manifest_missing_from_outputs, "missing_file", ['"lists/artifacts.jsonl"', "write the manifest"],
                 id="a manifest file that is not in the outputs is refused"),
    pytest.param(manifest_changed, "manifest_mismatch", ['"artifacts.jsonl"', "sha256"],
                 id="a manifest text that does not match the file is refused"),
    pytest.param(no_manifest_text, "manifest_unavailable", ['"artifacts.jsonl"', "must send it"],
                 id="a manifest whose text was not received is refused"),
    pytest.param(set_key("artifactsManifest", value="result.json"), "reserved_path", ["result.json itself"],
                 id="result.json as its own manifest is refused"),
    pytest.param(set_key("artifactsManifest", value="../artifacts.jsonl"), "path_traversal",
                 ['artifactsManifest "../artifacts.jsonl"'],
                 id="an artifactsManifest path that climbs out with .. is refused"),
    pytest.param(duplicate_listing, "duplicate_output_entry", ['"logs/train.txt" twice'],
                 id="a file listed twice by the worker is refused"),
    pytest.param(unhashed_listing, "invalid_file_list", ['"notes.txt"', "64-digit sha256"],
                 id="a regular file reported without its sha256 is refused"),
    pytest.param(sizeless_listing, "invalid_file_list", ['"notes.txt"', "byte size"],
                 id="a regular file reported without an integer size is refused"),
    pytest.param(manifest_sent_as_number, "invalid_type", ["manifest", "as text"],
                 id="a manifest text that is not text is refused"),
    pytest.param(extra_output("../outside.txt"), "path_traversal", ["output file", '"../outside.txt"'],
                 id="a reported output path that climbs out with .. is refused"),
]


@pytest.mark.parametrize(("change", "code", "fragments"), MALFORMED)
def test_a_malformed_result_is_rejected_with_its_code_and_a_message_naming_what_to_fix(change, code, fragments):
    scenario = Scenario()
    change(scenario)
    with pytest.raises(ResultError) as caught:
        scenario.run()
    error = caught.value
    assert error.code == code, error.message
    for fragment in fragments:
        assert fragment in error.message, (fragment, error.message)
    assert str(error) == error.message
    assert error.message.rstrip().endswith("."), error.message


def test_the_dataset_directory_limit_of_100000_files_is_enforced():
    count = MAX_DATASET_DIRECTORY_FILES + 1
    digest = sha(b"w")
    lines = [f'{{"path": "big/{i:06d}.wav", "sha256": "{digest}", "size": 1}}' for i in range(count)]
    text = "\n".join(lines) + "\n"
    files = [OutputFile(f"big/{i:06d}.wav", 1, digest) for i in range(count)]
    files.append(OutputFile("artifacts.jsonl", len(text), sha(text.encode())))
    result = {"version": 2, "complete": True, "artifactsManifest": "artifacts.jsonl",
              "datasets": [{"datasetId": "ds-big", "path": "big"}]}
    with pytest.raises(ResultError) as caught:
        validate_result(result, files, manifest_text=text, max_files=count)
    assert caught.value.code == "too_many_dataset_files"
    assert "datasets[0]" in caught.value.message and "100001 files" in caught.value.message
    assert "at most 100000" in caught.value.message


# ----------------------------------------------------------------------------------- raw bytes

METRIC_DOC = '{"version": 1, "complete": true, "artifacts": [], "metrics": [{"name": "loss", "value": %s, "step": 1}]}'

MALFORMED_BYTES = [
    pytest.param(b'{"version": 1, "complete": true, "pad": "' + b"x" * (1024 * 1024) + b'"}', {},
                 "result_too_large", ["over the limit of 1048576 bytes", "1 MiB", "artifactsManifest"],
                 id="a result.json over 1 MiB is refused"),
    pytest.param(b'{"version": 1, "complete": true}', {"max_bytes": 10}, "result_too_large", ["limit of 10 bytes"],
                 id="a result.json over a smaller configured limit is refused"),
    pytest.param((METRIC_DOC % "NaN").encode(), {}, "non_finite_metric", ["NaN", "metrics[0].value", "finite number"],
                 id="a NaN literal as a metric value is refused"),
    pytest.param((METRIC_DOC % "Infinity").encode(), {}, "non_finite_metric", ["Infinity", "metrics[0].value"],
                 id="an Infinity literal as a metric value is refused"),
    pytest.param((METRIC_DOC % "-Infinity").encode(), {}, "non_finite_metric", ["-Infinity", "metrics[0].value"],
                 id="a -Infinity literal as a metric value is refused"),
    pytest.param((METRIC_DOC % "1e999").encode(), {}, "non_finite_metric", ["1e999", "metrics[0].value"],
                 id="a number that overflows to infinity is refused"),
    pytest.param(b'{"version": 2, "complete": true, "models": [{"path": "m", "metadata": {"lr": NaN}}]}', {},
                 "non_finite_number", ["models[0].metadata.lr", "NaN"], id="a NaN literal anywhere else is refused"),
    pytest.param(b'{"version": 2, "complete": true,', {}, "invalid_json", ["not valid JSON", "line 1"],
                 id="truncated JSON is refused"),
    pytest.param(b"", {}, "invalid_json", ["result.json is empty"], id="an empty result.json is refused"),
    pytest.param(b'[{"version": 2}]', {}, "not_an_object", ["holds a list", "one JSON object"],
                 id="a top level list is refused"),
    pytest.param(b'{"version": 2, "complete": true, "x": "\xff"}', {}, "invalid_encoding", ["not valid UTF-8"],
                 id="bytes that are not UTF-8 are refused"),
    pytest.param(b'\xef\xbb\xbf{"version": 2, "complete": true}', {}, "invalid_encoding", ["byte order mark"],
                 id="a byte order mark is refused"),
    pytest.param(b'{"version": 2, "complete": false, "complete": true}', {}, "duplicate_key",
                 ['"complete" twice', "keep one"], id="a key repeated in one object is refused"),
]


@pytest.mark.parametrize(("raw", "kwargs", "code", "fragments"), MALFORMED_BYTES)
def test_a_malformed_result_file_is_rejected_while_parsing(raw, kwargs, code, fragments):
    with pytest.raises(ResultError) as caught:
        parse_result_json(raw, **kwargs)
    assert caught.value.code == code, caught.value.message
    for fragment in fragments:
        assert fragment in caught.value.message, (fragment, caught.value.message)


def test_the_location_of_an_error_is_given_as_a_json_path():
    with pytest.raises(ResultError) as caught:
        parse_result_json((METRIC_DOC % "NaN").encode())
    assert caught.value.location == "metrics[0].value"
    scenario = Scenario()
    set_key("artifacts", 0, "md5", value="abc")(scenario)
    with pytest.raises(ResultError) as caught:
        scenario.run()
    assert caught.value.location == "artifacts[0].md5"


def test_the_manifest_decoder_refuses_invalid_utf8_and_oversized_text():
    with pytest.raises(ResultError) as caught:
        decode_manifest(b"\xff\n", path="artifacts.jsonl")
    assert caught.value.code == "invalid_encoding" and '"artifacts.jsonl"' in caught.value.message
    with pytest.raises(ResultError) as caught:
        decode_manifest(b"x" * (2 * 4096 + 1), max_files=2)
    assert caught.value.code == "manifest_too_large" and "8192 bytes" in caught.value.message
    assert decode_manifest('{"path": "é"}\n'.encode()) == '{"path": "é"}\n'


# ----------------------------------------------------------------------------------- valid results


def test_a_valid_version_1_result_returns_its_artifacts_and_metrics_exactly():
    raw = json.dumps({
        "version": 1,
        "complete": True,
        "artifacts": [
            declared("model/weights.bin", WEIGHTS),
            declared("logs/train.txt", LOG),
            declared("report.html", b"<p>ok</p>", mimeType="text/html; charset=utf-8"),
        ],
        "metrics": [
            {"name": "train.loss", "value": 0.12, "step": 100},
            {"name": "train.loss", "value": 1, "step": 0, "timestamp": "2024-05-01T12:00:00Z"},
            {"name": "eval.accuracy", "value": -3.5e-3},
        ],
    }).encode()
    files = [
        output("model/weights.bin", WEIGHTS), output("logs/train.txt", LOG), output("report.html", b"<p>ok</p>"),
        output("logs", kind="dir"), output("model", kind="dir"), output("result.json", raw),
    ]
    result = validate_result(parse_result_json(raw), files)
    assert result == ValidatedResult(
        version=1,
        artifacts=[
            {"path": "model/weights.bin", "sha256": sha(WEIGHTS), "size": len(WEIGHTS),
             "mime_type": "application/octet-stream"},
            {"path": "logs/train.txt", "sha256": sha(LOG), "size": len(LOG), "mime_type": "text/plain"},
            {"path": "report.html", "sha256": sha(b"<p>ok</p>"), "size": 9, "mime_type": "text/html; charset=utf-8"},
        ],
        metrics=[
            {"name": "train.loss", "value": 0.12, "step": 100, "timestamp": None},
            {"name": "train.loss", "value": 1.0, "step": 0, "timestamp": "2024-05-01T12:00:00Z"},
            {"name": "eval.accuracy", "value": -0.0035, "step": 0, "timestamp": None},
        ],
        models=[],
        datasets=[],
        manifest_path=None,
    )
    assert isinstance(result.metrics[1]["value"], float)


def _path_digest(files: list[tuple[str, bytes]]) -> str:
    lines = "".join(f"{sha(content)} {len(content)} {path}\n" for path, content in sorted(files))
    return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def test_a_valid_version_2_result_returns_artifacts_metrics_models_and_datasets_exactly():
    scenario = Scenario()
    scenario.result["models"] = [{"path": "model/weights.bin", "modelId": 42, "metadata": {"arch": "conformer"}}]
    scenario.result["datasets"] = [
        {"datasetId": "ds-audio", "path": "prepared/", "schema": {"type": "audio"}},
        {"datasetId": "ds-logs", "path": "logs/train.txt", "metadata": {"split": "train"}},
        {"datasetId": 7, "uri": "s3://bucket/eval", "digest": "etag-123"},
    ]
    scenario.result["metrics"].append({"name": "eval.wer", "value": 0.08, "step": 2**53 - 1,
                                       "timestamp": "2024-05-01T21:00:00.250+09:00"})
    result = scenario.run()
    audio = [(path.removeprefix("prepared/"), content) for path, content in AUDIO.items()]
    wav_type = mimetypes.MimeTypes().guess_type("a.wav")[0]  # Python's built-in table; it varies by version
    assert result.version == 2
    assert result.manifest_path == "artifacts.jsonl"
    assert result.artifacts == [
        {"path": "model/weights.bin", "sha256": sha(WEIGHTS), "size": len(WEIGHTS),
         "mime_type": "application/octet-stream"},
        {"path": "logs/train.txt", "sha256": sha(LOG), "size": len(LOG), "mime_type": "text/plain"},
        *({"path": path, "sha256": sha(content), "size": len(content), "mime_type": wav_type}
          for path, content in AUDIO.items()),
    ]
    assert result.metrics == [
        {"name": "train.loss", "value": 0.12, "step": 100, "timestamp": None},
        {"name": "eval.wer", "value": 0.08, "step": 2**53 - 1, "timestamp": "2024-05-01T21:00:00.250+09:00"},
    ]
    assert result.models == [{"path": "model/weights.bin", "model_id": "42", "sha256": sha(WEIGHTS),
                              "size": len(WEIGHTS), "metadata": {"arch": "conformer"}}]
    assert result.datasets == [
        {"dataset_id": "ds-audio", "source": "path", "path": "prepared", "uri": None, "is_directory": True,
         "digest": _path_digest(audio),
         "files": [{"path": path, "sha256": sha(content), "size": len(content)} for path, content in sorted(audio)],
         "file_count": 3, "size": sum(len(content) for _, content in audio), "schema": {"type": "audio"},
         "metadata": {}},
        {"dataset_id": "ds-logs", "source": "path", "path": "logs/train.txt", "uri": None, "is_directory": False,
         "digest": _path_digest([("train.txt", LOG)]),
         "files": [{"path": "train.txt", "sha256": sha(LOG), "size": len(LOG)}], "file_count": 1, "size": len(LOG),
         "schema": {}, "metadata": {"split": "train"}},
        {"dataset_id": "7", "source": "uri", "path": None, "uri": "s3://bucket/eval", "is_directory": False,
         "digest": "etag-123", "files": [], "file_count": 0, "size": 0, "schema": {}, "metadata": {}},
    ]


def test_the_seed_example_parses_and_validates():
    weights = b"w" * 1024
    raw = json.dumps({
        "version": 2,
        "complete": True,
        "artifacts": [{"path": "model/weights.bin", "sha256": sha(weights), "size": len(weights)}],
        "metrics": [{"name": "train.loss", "value": 0.12, "step": 100}],
        "models": [{"path": "model/weights.bin"}],
    }, indent=2).encode()
    result = validate_result(parse_result_json(raw), [output("model/weights.bin", weights)])
    assert [a["path"] for a in result.artifacts] == ["model/weights.bin"]
    assert result.models == [{"path": "model/weights.bin", "model_id": None, "sha256": sha(weights),
                              "size": 1024, "metadata": {}}]
    assert result.datasets == [] and result.manifest_path is None


def test_artifacts_and_metrics_may_be_omitted_when_nothing_was_written():
    result = validate_result({"version": 1, "complete": True}, [output("result.json", b"{}")])
    assert (result.artifacts, result.metrics, result.models, result.datasets) == ([], [], [], [])


def test_an_upper_case_sha256_is_accepted_and_returned_in_lower_case():
    scenario = Scenario()
    scenario.result["artifacts"][0]["sha256"] = sha(WEIGHTS).upper()
    assert scenario.run().artifacts[0]["sha256"] == sha(WEIGHTS)


def test_a_manifest_with_crlf_line_ends_and_blank_lines_is_accepted():
    scenario = Scenario()
    scenario.manifest = "\r\n" + manifest_lines(AUDIO).replace("\n", "\r\n") + "\n\n"
    assert [a["path"] for a in scenario.run().artifacts][2:] == list(AUDIO)


def test_a_manifest_given_as_bytes_is_decoded_as_utf8():
    scenario = Scenario()
    result = validate_result(scenario.result, scenario.files(), manifest_text=scenario.manifest.encode())
    assert [a["path"] for a in result.artifacts][2:] == list(AUDIO)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(metric_points(1000), id="exactly 1000 metric points"),
        pytest.param(sixteen_models, id="exactly 16 models"),
        pytest.param(lambda s: s.result.update(models=[]), id="no models"),
        pytest.param(datasets(64), id="exactly 64 datasets"),
        pytest.param(metric(step=2**53 - 1), id="the largest step"),
        pytest.param(metric(value=-1e308), id="a large finite value"),
        pytest.param(lambda s: setattr(s, "max_files", 5), id="exactly max_files files"),
        pytest.param(rename_artifact("logs/" + "t" * 1019), id="a path of exactly 1024 characters"),
        pytest.param(rename_artifact("ログ/学習.txt"), id="a path with Japanese names"),
        pytest.param(rename_artifact("logs/a..b.txt"), id="a name containing two dots"),
        pytest.param(rename_artifact("logs/temp.tmp.txt"), id="a name with .tmp in the middle"),
        pytest.param(extra_output("logs", kind="dir"), id="a directory entry in the file list"),
        pytest.param(extra_output("checkpoints.tmp", kind="dir"), id="a directory whose name ends in .tmp"),
    ],
)
def test_a_result_at_a_limit_or_with_unusual_but_safe_names_is_accepted(change):
    scenario = Scenario()
    change(scenario)
    if "logs/train.txt" not in [a["path"] for a in scenario.result["artifacts"]]:
        scenario.contents[scenario.result["artifacts"][1]["path"]] = scenario.contents.pop("logs/train.txt")
    scenario.run()


def test_a_manifest_line_of_exactly_4_kib_is_accepted():
    # A path has at most 1024 characters, so only escaped non-ASCII names reach 4 KiB: "\\u3042" is 6 bytes.
    scenario = Scenario()
    entry = declared("prepared/" + "あ" * 650 + ".wav", b"x")
    padding = 4096 - len(json.dumps(entry))
    entry["path"] = "prepared/" + "あ" * 650 + "x" * padding + ".wav"
    line = json.dumps(entry)
    assert len(line.encode()) == 4096 and len(entry["path"]) <= 1024
    scenario.manifest += line + "\n"
    scenario.contents[entry["path"]] = b"x"
    assert scenario.run().artifacts[-1]["path"] == entry["path"]


def test_a_result_of_exactly_1_mib_is_accepted():
    doc = b'{"version": 1, "complete": true}'
    raw = doc[:-1] + b" " * (1024 * 1024 - len(doc)) + b"}"
    assert len(raw) == 1024 * 1024
    assert parse_result_json(raw) == {"version": 1, "complete": True}


def test_result_json_need_not_appear_in_the_file_list():
    scenario = Scenario()
    files = [f for f in scenario.files() if f.path != "result.json"]
    result = validate_result(scenario.result, files, manifest_text=scenario.manifest)
    assert len(result.artifacts) == 5


def test_the_validator_does_not_modify_the_parsed_document():
    scenario = Scenario()
    before = copy.deepcopy(scenario.result)
    scenario.run()
    assert scenario.result == before


# -- the output-file limit: which setting decides it (issue 14) -------------------------------------------

@pytest.mark.parametrize("change", [many_files, manifest_over_limit], ids=["outputs directory", "manifest"])
def test_a_limit_the_server_decides_names_the_servers_setting(change):
    """The server's MADO_MAX_OUTPUT_FILES below the worker's setting: raising the worker's would not help."""
    scenario = Scenario()
    change(scenario)
    with pytest.raises(ResultError) as refused:
        validate_result(scenario.result, scenario.files(), manifest_text=scenario.manifest,
                        max_files=scenario.max_files, limit_setting=SERVER_LIMIT_SETTING)
    message = refused.value.message
    assert refused.value.code == "too_many_files"
    assert f"limit of {scenario.max_files} files" in message or f"limit is {scenario.max_files}" in message
    assert "ask the server's administrator to raise MADO_MAX_OUTPUT_FILES" in message, message
    assert "raise MMT_WORKER_MAX_OUTPUT_FILES" not in message, message


def test_a_limit_no_setting_can_change_names_none():
    """A site's runner: no worker whose setting could raise the limit."""
    scenario = Scenario()
    many_files(scenario)
    with pytest.raises(ResultError) as refused:
        validate_result(scenario.result, scenario.files(), manifest_text=scenario.manifest, max_files=4,
                        limit_setting=None)
    assert "write fewer output files" in refused.value.message and "MAX_OUTPUT_FILES" not in refused.value.message


def test_directories_do_not_count_towards_the_output_file_limit(tmp_path):
    """Three files, each in its own directory, and result.json: within a limit of 3 files, so the listing is
    whole (it used to stop after 5 entries of any kind, and the worker then judged a cut listing)."""
    for name in ("a", "b", "c"):
        (tmp_path / name / "deeper").mkdir(parents=True)
        (tmp_path / name / "deeper" / "out.bin").write_bytes(name.encode())
    (tmp_path / "result.json").write_text("{}")
    files, too_many = walk_outputs(str(tmp_path), 3)
    assert not too_many
    assert sorted(f["path"] for f in files if f["kind"] == "file") == [
        "a/deeper/out.bin", "b/deeper/out.bin", "c/deeper/out.bin", "result.json"]
    (tmp_path / "d").mkdir()
    for name in ("d/1", "d/2"):
        (tmp_path / name).write_bytes(b"x")
    assert walk_outputs(str(tmp_path), 3)[1] is True, "five files and result.json are more than 3 + 2"
