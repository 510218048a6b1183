#!/usr/bin/env python3
"""An in-memory S3 server for libs/s3's tests: one bucket, path-style, HTTP/1.1 keep-alive.

It checks every request's SigV4 Authorization header by recomputing it here from the spec with
hmac/hashlib (not with the C++ code under test): it decodes the path and query as a server
does and encodes them again itself, so an encoding mistake in the client fails the signature.
It checks x-amz-content-sha256 against the body, as S3 does. Objects, multipart uploads,
ranged GETs, If-None-Match, ListObjectsV2 paging (with LastModified), ListMultipartUploads
paging (with Initiated); S3's XML errors.

Tests steer it through /_control/ (not signed):
  POST /_control/fault  JSON {"method": "PUT", "query": "partNumber", "status": 503,
                              "code": "SlowDown", "count": 2, "delay_s": 0, "drop": false,
                              "retry_after": null}
        the next `count` requests that match (method, and a query parameter name if given) get
        `status` with S3 error `code`, or wait `delay_s` first, or lose their connection (`drop`).
        Faults that let the request through and spoil its answer instead:
          "lose_response": true  the request takes effect, then the connection closes unanswered
                                 (a response lost on the way)
          "extra_bytes": N       a ranged GET's 206 body carries N bytes more than the range
          "omit_times": true     listings leave out LastModified / Initiated
  GET  /_control/log      JSON list of the requests served so far (method, key, query, headers).
  GET  /_control/uploads  JSON list of open multipart upload ids.

Usage: fake_s3_server.py --port_file=F [--bucket=B] [--region=R] [--access_key=A]
       [--secret_key=S] [--page_size=N] [--ignore_if_none_match] [--min_part_size=N]
       [--tls_cert=PEM --tls_key=PEM]
"""

import argparse
import base64
import datetime
import hashlib
import hmac
import http.server
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
import uuid

AUTH_RE = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request,\s*"
    r"SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")


def s3_time(seconds):
    # S3's ISO 8601 form, in UTC, with milliseconds.
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (moment.microsecond // 1000)


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def hmac_sha256(key, text):
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def encode(raw_bytes, safe):
    # RFC 3986 unreserved characters stay; every other byte becomes %XY (uppercase).
    return urllib.parse.quote(raw_bytes, safe=safe)


def xml_escape(text):
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.objects = {}  # key (str) -> bytes
        self.etags = {}  # key -> ETag, quoted (multipart ETags are not the MD5 of the bytes)
        self.modified = {}  # key -> time.time() of its last write
        self.uploads = {}  # upload id -> {"key": str, "parts": {n: bytes}, "initiated": time}
        self.faults = []
        self.log = []


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeS3/1.0"

    def log_message(self, fmt, *args):  # Quiet: the test prints what it needs.
        pass

    def do_GET(self):
        self.dispatch()

    def do_HEAD(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    # --- responses -------------------------------------------------------------------------

    def cut_connection(self):
        """Closes the connection without an answer (the client sees it reset or closed)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def send(self, status, body=b"", headers=None, content_length=None):
        if getattr(self, "fault", {}).get("lose_response"):
            self.cut_connection()
            return
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length",
                         str(len(body) if content_length is None else content_length))
        self.send_header("x-amz-request-id", self.request_id)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def error(self, status, code, message, headers=None):
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                "<Message>%s</Message><Resource>%s</Resource><RequestId>%s</RequestId></Error>" %
                (code, xml_escape(message), xml_escape(self.path), self.request_id)).encode()
        self.send(status, body if self.command != "HEAD" else b"",
                  dict({"Content-Type": "application/xml"}, **(headers or {})))

    # --- dispatch --------------------------------------------------------------------------

    def dispatch(self):
        cfg = self.server.cfg
        state = self.server.state
        self.request_id = uuid.uuid4().hex[:16].upper()
        self.fault = {}  # this request's (a keep-alive connection serves many).
        raw_path, _, raw_query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""

        if raw_path.startswith("/_control/"):
            return self.control(raw_path, body)

        query = []
        for part in raw_query.split("&") if raw_query else []:
            name, _, value = part.partition("=")
            query.append((urllib.parse.unquote_to_bytes(name), urllib.parse.unquote_to_bytes(value)))
        query_dict = {n.decode(): v.decode() for n, v in query}
        path_bytes = urllib.parse.unquote_to_bytes(raw_path)
        segments = path_bytes.split(b"/", 2)  # b"", bucket, key
        bucket = segments[1].decode() if len(segments) > 1 else ""
        key = segments[2].decode("utf-8") if len(segments) > 2 else ""

        entry = {"method": self.command, "bucket": bucket, "key": key, "query": query_dict,
                 "headers": {k.lower(): v for k, v in self.headers.items()
                             if k.lower() in ("range", "if-none-match", "x-amz-content-sha256",
                                              "content-type", "expect")},
                 "body_bytes": len(body)}
        with state.lock:
            state.log.append(entry)
            fault = None
            for f in state.faults:
                if f["count"] > 0 and f.get("method", self.command) == self.command and (
                        not f.get("query") or f["query"] in query_dict):
                    f["count"] -= 1
                    fault = dict(f)
                    break
        self.fault = fault or {}
        if fault:
            if fault.get("delay_s"):
                time.sleep(fault["delay_s"])
            if fault.get("drop"):
                self.cut_connection()
                return
            if fault.get("status"):
                extra = {}
                if fault.get("retry_after") is not None:
                    extra["Retry-After"] = str(fault["retry_after"])
                return self.error(fault["status"], fault.get("code", "InternalError"),
                                  "injected by the test", extra)

        problem = self.check_signature(raw_path, query, body)
        if problem:
            return self.error(*problem)
        if bucket != cfg.bucket:
            return self.error(404, "NoSuchBucket", "no bucket %r" % bucket)
        if not key:
            if self.command == "GET" and query_dict.get("list-type") == "2":
                return self.list_objects(query_dict)
            if self.command == "GET" and "uploads" in query_dict:
                return self.list_uploads(query_dict)
            if self.command == "PUT":
                return self.error(409, "BucketAlreadyOwnedByYou", "bucket exists")
            return self.error(400, "InvalidRequest", "unsupported bucket request")
        if self.command == "POST" and "uploads" in query_dict:
            return self.create_upload(key)
        if self.command == "PUT" and "uploadId" in query_dict:
            return self.upload_part(key, query_dict, body)
        if self.command == "POST" and "uploadId" in query_dict:
            return self.complete_upload(key, query_dict["uploadId"], body)
        if self.command == "DELETE" and "uploadId" in query_dict:
            with state.lock:
                if state.uploads.pop(query_dict["uploadId"], None) is None:
                    return self.error(404, "NoSuchUpload", "no upload")
            return self.send(204)
        if self.command == "PUT":
            return self.put_object(key, body)
        if self.command in ("GET", "HEAD"):
            return self.get_object(key)
        if self.command == "DELETE":
            with state.lock:
                state.objects.pop(key, None)
                state.etags.pop(key, None)
                state.modified.pop(key, None)
            return self.send(204)
        return self.error(405, "MethodNotAllowed", self.command)

    def check_signature(self, raw_path, query, body):
        cfg = self.server.cfg
        match = AUTH_RE.match(self.headers.get("Authorization", ""))
        if not match:
            return (400, "AuthorizationHeaderMalformed", "no SigV4 Authorization header")
        access_key, date, region, service, signed_headers, signature = match.groups()
        if access_key != cfg.access_key:
            return (403, "InvalidAccessKeyId", "unknown access key")
        if region != cfg.region or service != "s3":
            return (400, "AuthorizationHeaderMalformed", "scope %s/%s" % (region, service))
        names = signed_headers.split(";")
        for required in ("host", "x-amz-date", "x-amz-content-sha256"):
            if required not in names:
                return (400, "AuthorizationHeaderMalformed", "%s is not signed" % required)
        if names != sorted(names):
            return (403, "SignatureDoesNotMatch", "SignedHeaders not sorted")
        amz_date = self.headers.get("x-amz-date", "")
        try:
            when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(
                tzinfo=datetime.timezone.utc)
        except ValueError:
            return (403, "AccessDenied", "bad x-amz-date %r" % amz_date)
        if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 900:
            return (403, "RequestTimeTooSkewed", "x-amz-date too far from now")
        if date != amz_date[:8]:
            return (403, "SignatureDoesNotMatch", "scope date differs from x-amz-date")
        payload_hash = self.headers.get("x-amz-content-sha256", "")
        if payload_hash != "UNSIGNED-PAYLOAD" and payload_hash != sha256_hex(body):
            return (400, "XAmzContentSHA256Mismatch", "body does not match x-amz-content-sha256")

        canonical_uri = encode(urllib.parse.unquote_to_bytes(raw_path), "/-_.~")
        canonical_query = "&".join(
            "%s=%s" % pair for pair in sorted((encode(n, "-_.~"), encode(v, "-_.~"))
                                              for n, v in query))
        header_lines = ""
        for name in names:
            value = self.headers.get(name)
            if value is None:
                return (403, "SignatureDoesNotMatch", "signed header %s missing" % name)
            header_lines += "%s:%s\n" % (name, " ".join(value.split()))
        canonical_request = "\n".join([self.command, canonical_uri, canonical_query, header_lines,
                                       signed_headers, payload_hash])
        scope = "%s/%s/%s/aws4_request" % (date, region, service)
        string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                                    sha256_hex(canonical_request.encode())])
        key = ("AWS4" + cfg.secret_key).encode()
        for part in (date, region, service, "aws4_request"):
            key = hmac_sha256(key, part)
        expected = hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            return (403, "SignatureDoesNotMatch",
                    "The request signature we calculated does not match the signature you "
                    "provided. Canonical request: " + canonical_request)
        return None

    # --- operations ------------------------------------------------------------------------

    def put_object(self, key, body):
        state = self.server.state
        with state.lock:
            if (self.headers.get("If-None-Match") == "*" and key in state.objects
                    and not self.server.cfg.ignore_if_none_match):
                return self.error(412, "PreconditionFailed", "object exists")
            state.objects[key] = body
            state.etags[key] = '"%s"' % hashlib.md5(body).hexdigest()
            state.modified[key] = time.time()
        return self.send(200, headers={"ETag": state.etags[key]})

    def get_object(self, key):
        with self.server.state.lock:
            data = self.server.state.objects.get(key)
            etag = {"ETag": self.server.state.etags.get(key), "Accept-Ranges": "bytes"}
        if data is None:
            return self.error(404, "NoSuchKey", "The specified key does not exist.")
        if self.command == "HEAD":
            return self.send(200, headers=etag, content_length=len(data))
        range_header = self.headers.get("Range")
        if not range_header:
            return self.send(200, data, etag)
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", range_header)
        if not match:
            return self.error(400, "InvalidArgument", "Range %r" % range_header)
        first, last = int(match.group(1)), int(match.group(2))
        if first >= len(data):
            return self.error(416, "InvalidRange", "The requested range is not satisfiable")
        last = min(last, len(data) - 1)
        etag["Content-Range"] = "bytes %d-%d/%d" % (first, last, len(data))
        extra = b"x" * self.fault.get("extra_bytes", 0)
        return self.send(206, data[first:last + 1] + extra, etag)

    def list_objects(self, query):
        cfg = self.server.cfg
        prefix = query.get("prefix", "")
        max_keys = min(int(query.get("max-keys", "1000")), cfg.page_size)
        after = ""
        if "continuation-token" in query:
            token = query["continuation-token"]
            if not (token.startswith("page/") and token.endswith("+")):
                return self.error(400, "InvalidArgument", "continuation token %r" % token)
            after = base64.b64decode(token[5:-1]).decode()
        after = max(after, query.get("start-after", ""))
        with self.server.state.lock:
            keys = sorted(k for k in self.server.state.objects if k.startswith(prefix) and k > after)
            page = [(k, self.server.state.objects[k], self.server.state.etags[k],
                     self.server.state.modified[k]) for k in keys[:max_keys]]
        truncated = len(keys) > max_keys
        out = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult "
               "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>%s</Name>"
               "<Prefix>%s</Prefix><KeyCount>%d</KeyCount><MaxKeys>%d</MaxKeys>"
               "<IsTruncated>%s</IsTruncated>" %
               (cfg.bucket, xml_escape(prefix), len(page), max_keys,
                "true" if truncated else "false")]
        for k, data, etag, modified in page:
            modified_xml = ("" if self.fault.get("omit_times") else
                            "<LastModified>%s</LastModified>" % s3_time(modified))
            out.append("<Contents><Key>%s</Key>%s<ETag>%s</ETag>"
                       "<Size>%d</Size><StorageClass>STANDARD</StorageClass></Contents>" %
                       (xml_escape(k), modified_xml, xml_escape(etag), len(data)))
        if truncated:
            # A token with '+', '/' and '=' in it, so the client must encode it in the query.
            token = "page/" + base64.b64encode(page[-1][0].encode()).decode() + "+"
            out.append("<NextContinuationToken>%s</NextContinuationToken>" % token)
        out.append("</ListBucketResult>")
        return self.send(200, "".join(out).encode(), {"Content-Type": "application/xml"})

    def list_uploads(self, query):
        # Pages of --page_size, in (key, upload id) order, continued by key-marker and
        # upload-id-marker as S3 does.
        cfg = self.server.cfg
        prefix = query.get("prefix", "")
        after = (query.get("key-marker", ""), query.get("upload-id-marker", ""))
        with self.server.state.lock:
            listed = sorted((u["key"], upload_id, u["initiated"])
                            for upload_id, u in self.server.state.uploads.items()
                            if u["key"].startswith(prefix) and (u["key"], upload_id) > after)
        page = listed[:cfg.page_size]
        truncated = len(listed) > len(page)
        out = ["<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListMultipartUploadsResult>"
               "<Bucket>%s</Bucket><Prefix>%s</Prefix><IsTruncated>%s</IsTruncated>" %
               (cfg.bucket, xml_escape(prefix), "true" if truncated else "false")]
        if truncated:
            out.append("<NextKeyMarker>%s</NextKeyMarker><NextUploadIdMarker>%s"
                       "</NextUploadIdMarker>" % (xml_escape(page[-1][0]), xml_escape(page[-1][1])))
        for key, upload_id, initiated in page:
            initiated_xml = ("" if self.fault.get("omit_times") else
                             "<Initiated>%s</Initiated>" % s3_time(initiated))
            out.append("<Upload><Key>%s</Key><UploadId>%s</UploadId>%s</Upload>" %
                       (xml_escape(key), xml_escape(upload_id), initiated_xml))
        out.append("</ListMultipartUploadsResult>")
        return self.send(200, "".join(out).encode(), {"Content-Type": "application/xml"})

    def create_upload(self, key):
        upload_id = "upload/" + uuid.uuid4().hex + "+=="  # Needs encoding in later queries.
        with self.server.state.lock:
            self.server.state.uploads[upload_id] = {"key": key, "parts": {},
                                                    "initiated": time.time()}
        body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult>"
                "<Bucket>%s</Bucket><Key>%s</Key><UploadId>%s</UploadId>"
                "</InitiateMultipartUploadResult>" %
                (self.server.cfg.bucket, xml_escape(key), xml_escape(upload_id)))
        return self.send(200, body.encode(), {"Content-Type": "application/xml"})

    def upload_part(self, key, query, body):
        with self.server.state.lock:
            upload = self.server.state.uploads.get(query["uploadId"])
            if upload is None or upload["key"] != key:
                return self.error(404, "NoSuchUpload", "no upload %r" % query["uploadId"])
            upload["parts"][int(query["partNumber"])] = body
        return self.send(200, headers={"ETag": '"%s"' % hashlib.md5(body).hexdigest()})

    def complete_upload(self, key, upload_id, body):
        cfg = self.server.cfg
        listed = re.findall(r"<Part><PartNumber>(\d+)</PartNumber><ETag>([^<]*)</ETag></Part>",
                            body.decode())
        state = self.server.state
        with state.lock:
            upload = state.uploads.get(upload_id)
            if upload is None or upload["key"] != key:
                return self.error(404, "NoSuchUpload", "no upload %r" % upload_id)
            numbers = [int(n) for n, _ in listed]
            if not listed or numbers != sorted(numbers):
                return self.error(400, "InvalidPartOrder", "parts %r" % numbers)
            pieces = []
            for i, (number, etag) in enumerate(listed):
                data = upload["parts"].get(int(number))
                etag = etag.replace("&quot;", '"')
                if data is None or etag != '"%s"' % hashlib.md5(data).hexdigest():
                    return self.error(400, "InvalidPart", "part %s" % number)
                if i + 1 < len(listed) and len(data) < cfg.min_part_size:
                    return self.error(400, "EntityTooSmall", "part %s is %d bytes" %
                                      (number, len(data)))
                pieces.append(data)
            if (self.headers.get("If-None-Match") == "*" and key in state.objects
                    and not cfg.ignore_if_none_match):
                return self.error(412, "PreconditionFailed", "object exists")
            etag = '"%s-%d"' % (hashlib.md5(b"".join(hashlib.md5(p).digest()
                                                      for p in pieces)).hexdigest(), len(pieces))
            state.objects[key] = b"".join(pieces)
            state.etags[key] = etag
            state.modified[key] = time.time()
            del state.uploads[upload_id]
        result = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult>"
                  "<Key>%s</Key><ETag>%s</ETag></CompleteMultipartUploadResult>" %
                  (xml_escape(key), xml_escape(etag)))
        return self.send(200, result.encode(), {"Content-Type": "application/xml"})

    # --- control ---------------------------------------------------------------------------

    def control(self, path, body):
        state = self.server.state
        with state.lock:
            if path == "/_control/fault" and self.command == "POST":
                fault = json.loads(body)
                fault.setdefault("count", 1)
                state.faults.append(fault)
                out = {"ok": True}
            elif path == "/_control/log":
                out = state.log
            elif path == "/_control/uploads":
                out = sorted(state.uploads)
            else:
                out = {"error": "unknown control " + path}
            data = json.dumps(out).encode()
        self.send(200, data, {"Content-Type": "application/json"})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port_file", required=True)
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (0.0.0.0 for clients in network namespaces)")
    parser.add_argument("--bucket", default="test-bucket")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--access_key", default="AKIDTEST")
    parser.add_argument("--secret_key", default="test/secret+key")
    parser.add_argument("--page_size", type=int, default=1000)
    parser.add_argument("--ignore_if_none_match", action="store_true")
    parser.add_argument("--min_part_size", type=int, default=5 << 20)
    parser.add_argument("--tls_cert")
    parser.add_argument("--tls_key")
    cfg = parser.parse_args()

    server = http.server.ThreadingHTTPServer((cfg.host, 0), Handler)
    server.daemon_threads = True
    server.cfg = cfg
    server.state = State()
    if cfg.tls_cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cfg.tls_cert, cfg.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    temp = cfg.port_file + ".tmp"
    with open(temp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(temp, cfg.port_file)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
