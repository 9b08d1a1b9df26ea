#!/usr/bin/env python3
"""The boto3 baseline of `weir-e2e backup`: puts every file of a directory into an S3 bucket with
8 threads, then gets them back into files with 8 threads, and prints "<upload MiB/s> <download MiB/s>".

Usage: s3-baseline.py DIR BUCKET PREFIX   (endpoint and keys from WEIR_TEST_S3_*, as
scripts/services exports them; `pip install boto3`)."""
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import boto3
from botocore.config import Config


def main():
    src, bucket, prefix = sys.argv[1:4]
    s3 = boto3.client(
        "s3",
        endpoint_url=os.environ["WEIR_TEST_S3_ENDPOINT"],
        aws_access_key_id=os.environ["WEIR_TEST_S3_ACCESS_KEY"],
        aws_secret_access_key=os.environ["WEIR_TEST_S3_SECRET_KEY"],
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=16),
    )
    names = sorted(os.listdir(src))
    total = sum(os.path.getsize(os.path.join(src, n)) for n in names) / (1 << 20)

    def put(name):
        with open(os.path.join(src, name), "rb") as f:
            s3.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=f.read())

    out = tempfile.mkdtemp()

    def get(name):
        # Restored to disk, as Weir's restore writes each file.
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"].read()
        with open(os.path.join(out, name), "wb") as f:
            f.write(body)

    with ThreadPoolExecutor(8) as pool:
        t0 = time.perf_counter()
        list(pool.map(put, names))
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        list(pool.map(get, names))
        down = time.perf_counter() - t0
    shutil.rmtree(out)
    print(f"{total / up:.1f} {total / down:.1f}")


if __name__ == "__main__":
    main()
