// Validates ServiceMonitor objects against the Prometheus Operator's schema, as compiled by the
// npm package @kubernetes-models/prometheus-operator (pinned in package-lock.json). Run by
// scripts/test helm, which installs that package and passes its node_modules directory.
//
//   node validate_servicemonitor.mjs NODE_MODULES_DIR SERVICEMONITORS.json
//
// The schema checks types, enums, required fields and patterns (e.g. durations). Like the CRD
// it comes from, it does not refuse unknown fields: the API server prunes those.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, file] = process.argv.slice(2);
const model = join(
  modules,
  "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js",
);
const { ServiceMonitor } = await import(pathToFileURL(model).href);

const objects = JSON.parse(readFileSync(file, "utf8"));
let failed = 0;
for (const object of objects) {
  const name = `${object.kind}/${object.metadata?.name}`;
  try {
    if (!ServiceMonitor.is(object)) {
      throw new Error(`apiVersion/kind is ${object.apiVersion}/${object.kind}`);
    }
    new ServiceMonitor(object).validate();
    console.log(`    ${name} is valid against monitoring.coreos.com/v1 ServiceMonitor`);
  } catch (error) {
    console.error(`    ${name} is NOT valid: ${error.message}`);
    failed += 1;
  }
}
process.exit(failed === 0 ? 0 : 1);
