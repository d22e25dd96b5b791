"""Who opens the tracking and registry pages (issue 16): the project's Runs, a Run, the comparison, a Run's
artifact, the Models page and a model version's download. Someone with no role in the project gets 404,
exactly as for a project that does not exist (the project must not leak); viewers read; anonymous people
are sent to sign in. An artifact path never reads outside the Run's artifact root."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client

from mado.services import Actor
from registry import services as registry
from tracking import services
from tracking.artifacts import root_of

pytestmark = pytest.mark.django_db

WEIGHTS = b"\x00weights\xff" * 64


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def body(response) -> bytes:
    return b"".join(response.streaming_content) if response.streaming else response.content


@pytest.fixture
def lab(world, settings, tmp_path):
    """Two Runs of lab (one with an artifact file), and a model version whose weights lab stores."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    first = services.create_run(Actor(world.member), None, world.project, run_name="first")
    second = services.create_run(Actor(world.member), None, world.project, run_name="second")
    root_of(first).mkdir(parents=True)
    (root_of(first) / "notes.txt").write_text("lab notes\n")
    (root_of(first) / "model.bin").write_bytes(WEIGHTS)
    model = registry.create_model(Actor(world.member), None, world.project, name="resnet")
    version = registry.create_version(Actor(world.member), None, model, source=f"runs:/{first.run_id}/model.bin")
    assert version.stored_path
    paths = {
        "runs": "/projects/{p}/runs/",
        "run": f"/projects/{{p}}/runs/{second.run_id}/",
        "panel": f"/projects/{{p}}/runs/{second.run_id}/panel",
        "compare": f"/projects/{{p}}/runs/compare?run={first.run_id}&run={second.run_id}",
        "artifact": f"/projects/{{p}}/runs/{first.run_id}/artifacts/notes.txt",
        "models": "/projects/{p}/models/",
        "download": f"/projects/{{p}}/models/{model.pk}/versions/{version.version}/download",
    }
    return {"first": first, "second": second, "model": model, "paths": paths}


def test_viewers_read_every_tracking_page_and_download(world, lab):
    viewer = client_for(world.viewer)
    for name, path in lab["paths"].items():
        response = viewer.get(path.format(p="lab"))
        assert response.status_code == 200, name
    assert body(viewer.get(lab["paths"]["artifact"].format(p="lab"))) == b"lab notes\n"
    assert body(viewer.get(lab["paths"]["download"].format(p="lab"))) == WEIGHTS
    assert "resnet" in viewer.get(lab["paths"]["models"].format(p="lab")).content.decode()


def test_people_without_a_role_in_the_project_get_404_as_for_a_project_that_does_not_exist(world, lab):
    nobody = User.objects.create_user("nemo", password="nemo-pass-123")  # no project at all
    for user in (world.outsider, nobody):  # the outsider is an admin of another project
        client = client_for(user)
        for name, path in lab["paths"].items():
            response = client.get(path.format(p="lab"))
            missing = client.get(path.format(p="no-such-project"))
            assert response.status_code == missing.status_code == 404, (user.username, name)
            # The same answer as for a project that does not exist, but for the address typed.
            assert "No project lab that you can see" in response.content.decode(), name
            assert "No project no-such-project that you can see" in missing.content.decode(), name
            assert b"lab notes" not in response.content and b"resnet" not in response.content


def test_lab_objects_under_another_projects_address_are_not_found(world, lab):
    """The outsider is an admin of `other`: lab's Runs, artifacts and models are not found there."""
    outsider = client_for(world.outsider)
    for name, path in lab["paths"].items():
        if name in ("runs", "models"):
            continue
        assert outsider.get(path.format(p="other")).status_code == 404, name


def test_anonymous_people_are_sent_to_sign_in(lab):
    anonymous = Client()
    for name, path in lab["paths"].items():
        response = anonymous.get(path.format(p="lab"))
        assert response.status_code == 302, name
        assert response["Location"].startswith("/login/?next="), name


def test_an_artifact_path_never_reads_outside_the_runs_artifact_root(world, lab, settings):
    first, second = lab["first"], lab["second"]
    root_of(second).mkdir(parents=True)
    (root_of(second) / "secret.txt").write_text("SECOND-RUN-SECRET\n")
    outside = Path(settings.MEDIA_ROOT) / "outside.txt"
    outside.write_text("OUTSIDE-THE-ROOT\n")
    (root_of(first) / "sub").mkdir()
    (root_of(first) / "sub" / "inner.txt").write_text("INNER-FILE\n")
    os.symlink(outside, root_of(first) / "link.txt")  # a link leading out of the root
    viewer = client_for(world.viewer)
    base = f"/projects/lab/runs/{first.run_id}/artifacts/"

    assert body(viewer.get(base + "sub/inner.txt")) == b"INNER-FILE\n"
    refused = [
        f"../{second.run_id}/secret.txt",               # a sibling Run's file
        quote(f"../{second.run_id}/secret.txt", safe=""),  # the same, with %2F for /
        "../../../outside.txt",
        "sub/../notes.txt",                              # inside, but '..' is refused outright
        "./notes.txt",
        "sub//inner.txt",
        str(outside),                                    # an absolute path: //…/outside.txt
        "link.txt",
        "sub",                                           # a directory
        "notes.txt%00.png",                              # NUL
        "sub%5Cinner.txt",                               # a backslash
        "x" * 300,                                       # longer than a file name may be
        "a/" * 1600 + "b",                               # longer than a path may be
    ]
    for path in refused:
        response = viewer.get(base + path)
        assert response.status_code == 404, path
        content = body(response)
        assert b"INNER-FILE" not in content and b"SECOND-RUN-SECRET" not in content
        assert b"OUTSIDE-THE-ROOT" not in content and b"lab notes" not in content
    message = viewer.get(base + "../" + second.run_id + "/secret.txt").content.decode()
    assert "No such artifact in this Run" in message and "without &#x27;..&#x27;" in message
    ja = viewer.get(base + "sub/../notes.txt", HTTP_ACCEPT_LANGUAGE="ja").content.decode()
    assert "このRunにそのArtifactはありません" in ja


def test_a_run_id_with_extra_characters_is_not_found_and_never_a_500(world, lab):
    first, second = lab["first"], lab["second"]
    viewer = client_for(world.viewer)
    assert viewer.get(f"/projects/lab/runs/{first.run_id}x/").status_code == 404
    assert viewer.get(f"/projects/lab/runs/{first.run_id}x/artifacts/notes.txt").status_code == 404
    compare = viewer.get("/projects/lab/runs/compare", {"run": [first.run_id + "x", second.run_id]})
    assert compare.status_code == 404
    huge = viewer.get("/projects/lab/runs/", {"experiment": "9" * 40, "page": "-1"})
    assert huge.status_code == 200
