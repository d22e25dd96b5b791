"""Settings → Computers → Compute groups: global administrators create, edit and delete groups of SSH
computers; everyone signed in sees them; a group that Jobs wait on or run on is not deleted."""
from __future__ import annotations

from computers.models import ComputeGroup
from mado.models import AuditEvent
from tests.cluster.conftest import create, session


def test_a_global_admin_creates_a_group_of_ssh_computers_and_everyone_sees_it(world, node_a, node_b):
    admin = session(world.global_admin)
    page = admin.get("/settings/computers/groups/new")
    assert page.status_code == 200 and "node-a" in page.content.decode()
    response = admin.post("/settings/computers/groups/new",
                          {"name": "lab-nodes", "description": "the two lab boxes",
                           "computers": [node_a.pk, node_b.pk]})
    assert response.status_code == 302
    group = ComputeGroup.objects.get()
    assert sorted(group.computers.values_list("name", flat=True)) == ["node-a", "node-b"]
    assert AuditEvent.objects.filter(action="compute_group.create", object_id=str(group.pk)).exists()
    listing = session(world.member).get("/settings/computers/groups/").content.decode()
    assert "lab-nodes" in listing and "node-a, node-b" in listing and "Add compute group" not in listing
    assert "Add compute group" in admin.get("/settings/computers/groups/").content.decode()


def test_others_cannot_change_groups(world, lab_nodes):
    member = session(world.member)
    assert member.get("/settings/computers/groups/new").status_code == 403
    assert member.post(f"/settings/computers/groups/{lab_nodes.pk}/delete").status_code == 403
    assert ComputeGroup.objects.filter(pk=lab_nodes.pk).exists()


def test_edit_renames_and_changes_members_and_bad_input_says_what_to_fix(world, lab_nodes, node_a, make_site):
    admin = session(world.global_admin)
    response = admin.post(f"/settings/computers/groups/{lab_nodes.pk}/edit",
                          {"name": "big nodes!", "computers": [node_a.pk]})
    assert response.status_code == 200 and "letters, digits" in response.content.decode()
    site = make_site(world.global_admin)
    response = admin.post(f"/settings/computers/groups/{lab_nodes.pk}/edit", {"name": "x", "computers": [site.pk]})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    response = admin.post(f"/settings/computers/groups/{lab_nodes.pk}/edit",
                          {"name": "a-nodes", "computers": [node_a.pk]}, HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and "computeGroupsChanged" in response["HX-Trigger"]
    lab_nodes.refresh_from_db()
    assert lab_nodes.name == "a-nodes" and list(lab_nodes.computers.values_list("name", flat=True)) == ["node-a"]


def test_a_group_with_a_queued_job_is_not_deleted(world, lab_nodes):
    job = create(world, cluster_size=2, cluster_mode="multi-node", compute_group=lab_nodes.pk)
    admin = session(world.global_admin)
    response = admin.post(f"/settings/computers/groups/{lab_nodes.pk}/delete")
    assert response.status_code == 200
    assert f"Jobs {job['id']} use the compute group lab-nodes" in response.content.decode()
    assert session(world.member).post(f"/api/jobs/{job['id']}/stop").status_code == 200
    assert admin.post(f"/settings/computers/groups/{lab_nodes.pk}/delete").status_code == 302
    assert not ComputeGroup.objects.exists()
    assert session(world.member).get(f"/api/jobs/{job['id']}").json()["compute_group"] is None
