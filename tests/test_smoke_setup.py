def test_the_health_endpoint_answers_without_a_token(client):
    response = client.get("/api/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_the_suite_runs_on_postgresql(db):
    from django.db import connection

    assert connection.vendor == "postgresql"
