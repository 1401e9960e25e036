// The webhook receiver a Node user would pick, for the side-by-side benchmark in
// docs/performance.md: @octokit/webhooks' own middleware on node:http, a no-op `workflow_job`
// handler, nothing persisted. Written the way the package's README shows it, with no tuning, so
// the comparison is with what people actually deploy.
//
// Usage: RM_WEBHOOK_SECRET=... node server.mjs [PORT]   (listens on 127.0.0.1 only)

import { createServer } from "node:http";
import { Webhooks, createNodeMiddleware } from "@octokit/webhooks";

const secret = process.env.RM_WEBHOOK_SECRET;
if (!secret) {
  console.error("node receiver: set RM_WEBHOOK_SECRET to the webhook secret");
  process.exit(2);
}
const port = Number(process.argv[2] ?? process.env.PORT ?? 8090);

const webhooks = new Webhooks({ secret });
// A no-op handler: the middleware answers 200 once the signature is verified, the payload parsed
// and every handler has returned.
webhooks.on("workflow_job", () => {});

const middleware = createNodeMiddleware(webhooks, { path: "/webhook" });
const server = createServer(async (req, res) => {
  // `middleware` returns false for paths other than /webhook (README's own pattern); the benchmark
  // script uses that 404 as its readiness probe.
  if (await middleware(req, res)) return;
  res.writeHead(404);
  res.end();
});

server.listen(port, "127.0.0.1", () => {
  console.error(`node receiver: @octokit/webhooks on http://127.0.0.1:${port}/webhook`);
});

// The benchmark script stops us with SIGTERM; exit promptly and quietly.
process.on("SIGTERM", () => server.close(() => process.exit(0)));
process.on("SIGINT", () => server.close(() => process.exit(0)));
