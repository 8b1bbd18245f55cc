/*
 * The rpc table every tracer agent serves, and its lifecycle.  The build's entry module is
 *   import { tracer } from './<tracer>.js'; serve(tracer);
 * where a tracer is { name, symbols(config), init?(config, cSources), install?(config),
 * uninstall?(config), extraExports? }.  docs/agents.md has the whole host <-> agent protocol.
 */

import { calibrate } from './calibrate.js';
import { setEnabled } from './core.js';
import { flush } from './flush.js';
import { announceModules, describeModule, symbolize } from './modules.js';
import { NATIVE_PLATFORM, moduleOf, now } from './platform.js';
import { recon } from './recon.js';
import { unwindLoad, unwindModules } from './unwind.js';

const DRAIN_INTERVAL_MS = 100;
const MODULE_SCAN_TICKS = 10;     // modules rescanned every 10th flush

const life = {
  config: null,
  timer: null,
  finished: false,
  tick: 0,
};

/* Crashes come through the exception handler: what was recorded is flushed first. */
function watchCrash() {
  Process.setExceptionHandler(details => {
    if (!life.finished) {
      try {
        flush();
      } catch (e) {
        // keep going: reporting the crash matters more
      }
      send({
        type: 'agent:crash', t: now(), kind: details.type,
        address: details.address.toString(), module: moduleOf(details.address),
      });
    }
    return false;
  });
}

export function serve(tracer) {
  rpc.exports = Object.assign({
    hello() {
      return {
        platform: NATIVE_PLATFORM, arch: Process.arch, pid: Process.id,
        pointerSize: Process.pointerSize, pageSize: Process.pageSize,
        fridaVersion: Frida.version, tracer: tracer.name,
        mainModule: describeModule(Process.mainModule),
      };
    },
    init(config, sources) {
      life.config = config;
      const found = recon(tracer.symbols(config));
      const info = tracer.init ? tracer.init(config, sources) : {};
      return { recon: found, info };
    },
    start() {
      announceModules();
      if (tracer.install)
        tracer.install(life.config);
      watchCrash();
      life.tick = 1;
      life.timer = setInterval(() => {
        flush();
        if (life.tick++ % MODULE_SCAN_TICKS === 0)
          announceModules();
      }, DRAIN_INTERVAL_MS);
      return { t: now() };
    },
    flush() {
      flush();
      return { t: now() };
    },
    stop() {
      if (life.finished)
        return { t: now() };
      life.finished = true;
      if (life.timer !== null)
        clearInterval(life.timer);
      setEnabled(false);
      if (tracer.uninstall)
        tracer.uninstall(life.config);
      flush();
      announceModules();
      return { t: now() };
    },
    /* Process exit is seen here: Frida runs dispose (and flushes what it sends) from its own
     * exit monitor; a JavaScript listener on exit() deadlocks against that monitor. */
    dispose() {
      if (life.finished)
        return;
      life.finished = true;
      try {
        // A tracer's last look at the process, hooks still in (malloc --leaks scans here).
        if (tracer.beforeExit)
          tracer.beforeExit(life.config);
      } catch (e) {
        send({ type: 'agent:warning', message: `at exit: ${e.message || e}` });
      }
      try {
        flush();
      } catch (e) {
        // the process is going away; nothing more to save
      }
      // Take our hooks out before Frida tears the agent down: its teardown with
      // replaced allocator entries still in place hangs the exiting process.
      setEnabled(false);
      try {
        if (tracer.uninstall)
          tracer.uninstall(life.config);
        Interceptor.detachAll();
        Interceptor.flush();
        flush();   // what uninstall itself reported (the fd tracer's end census)
      } catch (e) {
        // keep going: the goodbye message matters more
      }
      let calibration = null;
      try {
        calibration = calibrate();
      } catch (e) {
        calibration = null;
      }
      send({
        type: 'agent:exit', t: now(), exiting: true,
        status: null,
        how: 'process exit',
        calibration,
      });
    },
    symbolize(addresses) {
      return symbolize(addresses);
    },
    calibrate() {
      return calibrate();
    },
    /* Unwind tables for modules without frame pointers (runtime/unwind.js). */
    unwindModules() {
      return unwindModules();
    },
    unwindLoad(entries, data) {
      return unwindLoad(entries, data);
    },
  }, tracer.extraExports || {});
}
