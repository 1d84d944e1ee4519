"""A loopback S3 server: moto in server mode, which speaks the S3 HTTP
protocol. LanceDB's own object-store client talks to it, so the index
tests exercise real LanceDB I/O over HTTP, with no mock of kb's code."""

from __future__ import annotations

from contextlib import contextmanager

ACCESS_KEY_ID = "kb-test-access-key"
SECRET_ACCESS_KEY = "kb-test-secret-key-1234567890"
REGION = "us-east-1"


@contextmanager
def s3_server(bucket: str = "kb-index"):
    """Yield the endpoint URL of a moto S3 server on 127.0.0.1 that holds
    one empty bucket."""
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    # One log line per S3 request drowns every other line.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY_ID,
                     aws_secret_access_key=SECRET_ACCESS_KEY, region_name=REGION).create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.stop()


def s3_env(endpoint: str, uri: str) -> dict[str, str]:
    """The kb settings that put the index at `uri` on this server."""
    return {"KB_LANCE_URI": uri, "KB_S3_ENDPOINT": endpoint, "KB_S3_REGION": REGION,
            "KB_S3_ACCESS_KEY_ID": ACCESS_KEY_ID, "KB_S3_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
            "KB_S3_ALLOW_HTTP": "true"}


def object_keys(endpoint: str, bucket: str = "kb-index") -> list[str]:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY_ID,
                          aws_secret_access_key=SECRET_ACCESS_KEY, region_name=REGION)
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys += [item["Key"] for item in page.get("Contents", [])]
    return keys
