import http.server, json, sys, urllib.request
UP = sys.argv[2]; LOG = open(sys.argv[3], 'a')
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def fwd(self, body):
        req = urllib.request.Request(UP + self.path, data=body, method=self.command,
            headers={k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "accept-encoding")})
        try:
            r = urllib.request.urlopen(req, timeout=900); status = r.status; data = r.read(); hdrs = r.headers
        except urllib.error.HTTPError as e:
            status = e.code; data = e.read(); hdrs = e.headers
        try: b = json.loads(body) if body else None
        except Exception: b = None
        LOG.write(json.dumps({"method": self.command, "path": self.path, "req": b, "status": status, "resp": data.decode(errors="replace")}) + "\n"); LOG.flush()
        self.send_response(status)
        for k, v in hdrs.items():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"): self.send_header(k, v)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self): self.fwd(None)
    def do_POST(self): self.fwd(self.rfile.read(int(self.headers.get("Content-Length", 0))))
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
