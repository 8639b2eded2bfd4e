-- wrk script: the receiver's own rate for webhook-sized POSTs.
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["webhook-id"] = "1"
wrk.body = '{"type":"bench","timestamp":"2026-01-01T00:00:00+00:00","data":{"n":1}}'
