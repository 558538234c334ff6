/* Semihosting output and exit for the Cortex-M0 examples (startup.c). */
#ifndef ZEAL_STARTUP_H
#define ZEAL_STARTUP_H

void host_write(const char *text);
void host_exit(int ok);

#endif /* ZEAL_STARTUP_H */
