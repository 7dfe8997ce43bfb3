// Records a counter and a histogram with OpenTelemetry's JavaScript metrics SDK and exports them with its OTLP/HTTP
// exporter (JSON encoding, cumulative temporality: the defaults) to $OTLP_METRICS_URL with $OTLP_TOKEN: two exports,
// then one more at shutdown. Prints the values recorded and the exporter's results for tests/integration/test_otlp.py.
import { OTLPMetricExporter } from "@opentelemetry/exporter-metrics-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";

const exporter = new OTLPMetricExporter({
  url: process.env.OTLP_METRICS_URL,
  headers: { Authorization: `Bearer ${process.env.OTLP_TOKEN}` },
});
const results = [];
const send = exporter.export.bind(exporter);
exporter.export = (metrics, done) => send(metrics, (result) => { results.push(result.code); done(result); });

const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 3_600_000 });
const provider = new MeterProvider({
  resource: resourceFromAttributes({ "service.name": "storefront", "host.name": "node-2" }),
  readers: [reader],
});
const meter = provider.getMeter("storefront.meter");
const carts = meter.createCounter("carts");
const checkout = meter.createHistogram("checkout_ms");
const first = [4, 30, 30, 800];
const second = [12, 60, 3000];
carts.add(2, { region: "eu" });
first.forEach((v) => checkout.record(v));
await reader.forceFlush();
carts.add(3, { region: "eu" });
second.forEach((v) => checkout.record(v));
await reader.forceFlush();
await provider.shutdown();
console.log(JSON.stringify({ carts: [2, 3], checkout: [first, second], results }));
